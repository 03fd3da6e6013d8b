"""An export folder against the config that loads it: the role it plays (a renderer, the game-state MLLM)
and the model sizes it was trained at, read from its ``export.json`` before any weight loads.

Training (``phase.init_from``), evaluation, the game and the pipeline's representation and adaptation
steps all load exports; each composes these checks in its own pre-flight.
"""
from __future__ import annotations

from pathlib import Path

from animegamer.config.disk_checks import read_json_object
from animegamer.contracts.exports import EXPORTS, export_contract
from animegamer.contracts.files import EXPORT_FILE

EXPORT_SIZE_KEYS = {
    "encoder": ("text_dim", "image_dim", "text_tokens", "image_tokens", "width", "fusion", "mlp"),
    "decoder": ("num_layers", "num_attention_heads", "attention_head_dim", "in_channels", "out_channels",
                "patch_size", "time_embed_dim", "motion_scope"),
    "mllm": ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads"),
}
REPRESENTATION_KEYS = ("text_tokens", "image_tokens", "width", "fusion")  # what fixes N and D for the MLLM
LORA_PARTS = ("decoder", "mllm")  # the networks that carry a LoRA


# what an export given for a role must hold, and where users find one that does
EXPORT_ROLES = {"mllm": ("mllm", "the game-state MLLM: a phase (b) export, e.g. b/export"),
                "renderer": ("decoder", "a renderer: a phase (a) or (c) export, e.g. a_joint/export or c/export")}


def check_export_role(key: str, folder: str, role: str) -> list[str]:
    """``folder`` (given as ``key``) holds what ``role`` needs, by the phase its ``export.json`` names (an
    MLLM export where a renderer is wanted would otherwise fail while loading, as a traceback)."""
    record = read_json_object(Path(folder) / EXPORT_FILE) if folder else None
    phase = (record or {}).get("phase")
    part, wanted = EXPORT_ROLES[role]
    if not isinstance(phase, str) or phase not in EXPORTS or part in export_contract(phase).parts:
        return []
    return [f"{key}={folder!r} is a phase {phase} export, which holds no {part}; {key} wants {wanted}"]


def check_export_sizes(key: str, folder: str, model, parts: tuple[str, ...] | None = None) -> list[str]:
    """The model sizes an export was trained with (``export.json``'s config) against this config's.

    Parts default to what the export's phase exports (its spec's export contract): encoder and
    decoder for (a) / (c), the representation's N and D plus the LLM for (b). LoRA ranks are compared
    where the export holds a LoRA adapter."""
    record = read_json_object(Path(folder) / EXPORT_FILE) if folder else None
    saved = ((record or {}).get("config") or {}).get("model")
    if not isinstance(saved, dict):
        return []
    contract = export_contract(record.get("phase"))
    wrong = []
    for part in contract.parts if parts is None else parts:
        names = REPRESENTATION_KEYS if part == "encoder" and contract.rep_only else EXPORT_SIZE_KEYS[part]
        if part in LORA_PARTS and contract.lora_adapter:
            names = (*names, "lora_rank")
        recorded = saved.get(part) or {}
        for name in names:
            mine = getattr(getattr(model, part), name)
            if name in recorded and recorded[name] != mine:
                wrong.append(f"model.{part}.{name} {recorded[name]} (export) vs {mine} (this config)")
    if wrong:
        return [f"{key}={folder!r} was trained at other sizes: " + "; ".join(wrong)]
    return []
