"""What each training phase's export holds, by the phase name its ``export.json`` records.

The phases (:mod:`animegamer.phases.specs`) train and write these exports; the checks that compare an
export with a config (:mod:`animegamer.checkpoints.export_checks`), the game and the pipeline read
them. Keeping the table here lets those readers know an export's parts without importing the phases.
"""
from __future__ import annotations

from dataclasses import dataclass

A_BASE, A_WARMUP, A_JOINT, PHASE_B, PHASE_C = "a_base", "a_warmup", "a_joint", "b", "c"
TOKENIZER_DIR = "tokenizer"  # a phase (b) export's copy of the tokenizer it trained with
TRAIN_SECONDS = "train_seconds"  # export.json: wall seconds of training so far, resumed runs' included


@dataclass(frozen=True)
class ExportContract:
    """What a phase's export holds, as the checks compare an export with a config."""

    parts: tuple[str, ...]  # model.<part> nodes whose sizes its weights fix
    rep_only: bool  # of model.encoder only what fixes the representation's N and D (the MLLM's queries)
    lora_adapter: bool  # a peft LoRA adapter folder beside the tensors (its LoRA rank is compared too)


RECONSTRUCTION_EXPORT = ExportContract(("encoder", "decoder"), rep_only=False, lora_adapter=False)
RECONSTRUCTION_LORA_EXPORT = ExportContract(("encoder", "decoder"), rep_only=False, lora_adapter=True)

EXPORTS: dict[str, ExportContract] = {
    A_BASE: RECONSTRUCTION_EXPORT,  # the whole decoder, saved as a diffusers folder too
    A_WARMUP: RECONSTRUCTION_EXPORT,
    A_JOINT: RECONSTRUCTION_LORA_EXPORT,
    PHASE_B: ExportContract(("encoder", "mllm"), rep_only=True, lora_adapter=True),
    PHASE_C: RECONSTRUCTION_LORA_EXPORT,  # the decoder adapted to predicted representations, with the encoder
}


def export_contract(phase: object) -> ExportContract:
    """What an export recorded as made by ``phase`` holds (``export.json``'s ``phase``); exports that
    name no known phase are read as encoder + decoder without an adapter."""
    return EXPORTS.get(phase, RECONSTRUCTION_EXPORT) if isinstance(phase, str) else RECONSTRUCTION_EXPORT
