"""Importer of the official AnimeGamer MLLM checkpoint (``MLLM-*/pytorch_model.bin``) into :class:`GameStateMLLM`.

The official model (``ContinuousLVLM_Video``) is a peft-wrapped Mistral plus two resamplers; its
state dict is a plain dict of tensors with keys

- ``llm.base_model.model.<MistralForCausalLM name>``; LoRA unmerged, in the current peft naming
  (``...q_proj.base_layer.weight``, ``...q_proj.lora_A.default.weight``) or the older one without
  ``base_layer`` (``...q_proj.weight``, ``...q_proj.lora_A[.default].weight``): both are accepted;
- RMSNorms as peft ``modules_to_save`` copies: ``...input_layernorm.modules_to_save.default.weight``
  is the one the official forward uses and maps onto the (plain, trainable) norm; the frozen
  ``...original_module.weight`` copy is never read by that forward and is listed as known-unused;
- ``input_resampler.proj.{0,2}`` -> ``input_proj.{0,2}``, ``output_resampler.proj.{0,2}`` -> ``output_proj.{0,2}``.

A plain Hugging Face state dict (``model.layers...``, ``lm_head.weight``) or one prefixed
``base_model.model.`` is accepted as well. Names are compared after
:func:`animegamer.models.mllm_adapters.canonical_name`, so the import works whether or not the model wraps
its LLM with peft. The report lists every official key left unplaced and every module parameter
left unset, so a partial import is visible instead of silently training from random weights.

LoRA scaling: the checkpoint does not store alpha. ``official_lora_alpha`` (default: the model's
``cfg.lora_alpha``) is the alpha the official network was trained with; when the model's adapter
uses another alpha, ``lora_B`` is rescaled so the model computes the official network.
"""
from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Tuple

import torch

from animegamer.checkpoints.safe_load import SAFETENSORS_SUFFIX, load_safetensors, load_weights_only
from animegamer.models.lora import ADAPTER
from animegamer.models.mllm import GameStateMLLM
from animegamer.models.mllm_adapters import canonical_name
from animegamer.models.official_import import ImportReport, copy_into

logger = logging.getLogger(__name__)

__all__ = ["ImportReport", "load_official_mllm", "read_official_mllm_state_dict", "official_canonical_name"]

_RESAMPLERS = (("input_resampler.proj.", "input_proj."), ("output_resampler.proj.", "output_proj."))
_LLM_PREFIXES = (("llm.base_model.model.", "llm."), ("base_model.model.", "llm."), ("llm.", "llm."),
                 ("model.", "llm.model."), ("lm_head.", "llm.lm_head."))
_MODULES_TO_SAVE = re.compile(r"\.modules_to_save\.[^.]+\.")
_ORIGINAL_MODULE = ".original_module."
_LORA = re.compile(r"^(?P<module>.+)\.lora_(?P<which>[AB])\.weight$")
_WRAPPERS = ("module", "state_dict", "model")  # training-framework wrappers around the tensors
_BIN_PATTERNS = ("pytorch_model*.bin", "*.pt", "*.pth")


# --------------------------------------------------------------------------- reading
def read_official_mllm_state_dict(path: str | Path) -> Dict[str, torch.Tensor]:
    """All tensors of a checkpoint file or folder (``pytorch_model*.bin`` shards or ``*.safetensors``).

    ``.bin`` / ``.pt`` files are read with ``torch.load(weights_only=True)``: tensors only, no code; a
    file that needs more is refused (:mod:`animegamer.checkpoints.safe_load`).
    """
    path = Path(path).expanduser()
    if path.is_dir():
        files = sorted(path.glob("*.safetensors"))
        if not files:
            files = sorted(f for pattern in _BIN_PATTERNS for f in path.glob(pattern))
        if not files:
            raise FileNotFoundError(f"no pytorch_model*.bin, *.pt or *.safetensors file in {path}")
    elif path.is_file():
        files = [path]
    else:
        raise FileNotFoundError(f"official MLLM checkpoint not found: {path}")
    state: Dict[str, torch.Tensor] = {}
    for file in files:
        # memory-mapped: a 7B checkpoint is not read into memory twice
        part = load_safetensors(file) if file.suffix == SAFETENSORS_SUFFIX else load_weights_only(file)
        state.update(_unwrap(part, file))
    return state


def _unwrap(part: Mapping, file: Path) -> Dict[str, torch.Tensor]:
    for key in _WRAPPERS:
        if key in part and isinstance(part[key], Mapping):
            part = part[key]
            break
    tensors = {k: v for k, v in part.items() if isinstance(v, torch.Tensor)}
    if not tensors:
        raise ValueError(f"{file} holds no tensors")
    return tensors


# --------------------------------------------------------------------------- naming
def official_canonical_name(key: str) -> Tuple[Optional[str], str]:
    """(canonical name, kind) of an official key; kind is ``param``, ``lora`` or ``original`` (ignored copy).

    Returns (None, "unknown") for a key outside the LLM and the two resamplers.
    """
    if _ORIGINAL_MODULE in key:
        return None, "original"
    for official, ours in _RESAMPLERS:
        if key.startswith(official):
            return ours + key[len(official):], "param"
    for prefix, replacement in _LLM_PREFIXES:
        if key.startswith(prefix):
            key = replacement + key[len(prefix):]
            break
    else:
        return None, "unknown"
    key = _MODULES_TO_SAVE.sub(".", key)
    name = canonical_name(key)
    # old peft naming: ``q_proj.lora_A.weight`` is already canonical; ``lora_A.default.weight`` was handled
    return name, "lora" if _LORA.match(name) else "param"


# --------------------------------------------------------------------------- import
def load_official_mllm(path_or_state_dict: str | Path | Mapping[str, torch.Tensor], model: GameStateMLLM,
                       merge_lora: bool = False, official_lora_alpha: Optional[float] = None) -> ImportReport:
    """Load the official MLLM weights into ``model`` in place.

    ``merge_lora=False`` keeps the official LoRA as the model's adapter (added with the official rank
    when the model has none); ``merge_lora=True`` folds it into the base weights
    (W + alpha / r * B A), the start for training a fresh adapter (a model adapter is left as it is).
    Tensors whose shapes do not fit the configured sizes raise ``ValueError`` with the full list.
    """
    if isinstance(path_or_state_dict, Mapping):
        state = dict(path_or_state_dict)
        source = "state dict"
    else:
        state = read_official_mllm_state_dict(path_or_state_dict)
        source = str(path_or_state_dict)
    alpha = float(official_lora_alpha if official_lora_alpha is not None else model.cfg.lora_alpha)
    report = ImportReport()

    params: Dict[str, torch.Tensor] = {}  # canonical -> official tensor
    origin: Dict[str, str] = {}
    lora: Dict[str, Dict[str, Tuple[str, torch.Tensor]]] = {}  # module -> {"A"/"B": (key, tensor)}
    unplaced: List[str] = []
    for key, value in state.items():
        name, kind = official_canonical_name(key)
        if kind == "original":
            report.known_unused.append(key)
        elif kind == "unknown":
            unplaced.append(key)
        elif kind == "lora":
            match = _LORA.match(name)
            lora.setdefault(match["module"], {})[match["which"]] = (key, value)
        elif name in params:
            # both a modules_to_save copy and a plain tensor: the copy is what the official forward reads
            keep, drop = (key, origin[name]) if ".modules_to_save." in key else (origin[name], key)
            params[name], origin[name] = state[keep], keep
            unplaced.append(drop)
            report.notes.append(f"{drop}: duplicate of {keep} for {name}, not used")
        else:
            params[name], origin[name] = value, key

    pairs = {}
    for module, parts in lora.items():
        if set(parts) != {"A", "B"}:
            unplaced += [key for key, _ in parts.values()]
            report.notes.append(f"{module}: LoRA half without its partner, not used")
        else:
            pairs[module] = (parts["A"], parts["B"])

    if pairs and not merge_lora and not model.has_lora:
        rank = next(iter(pairs.values()))[0][1].shape[0]
        model.add_lora(model.lora_config(rank=rank, alpha=alpha))
        report.notes.append(f"added a rank-{rank} LoRA adapter (alpha {alpha:g}) to hold the official one")

    by_canonical = {canonical_name(n): n for n, _ in model.named_parameters()}
    module_params = dict(model.named_parameters())
    targets: Dict[str, torch.Tensor] = {}  # model parameter name -> value
    for name, value in params.items():
        if name in by_canonical:
            targets[by_canonical[name]] = value
        else:
            unplaced.append(origin[name])

    if pairs:
        if merge_lora:
            _merge(pairs, alpha, by_canonical, targets, unplaced, report)
        else:
            _place_lora(model, pairs, alpha, by_canonical, targets, unplaced, report)

    copy_into(module_params, targets, "MLLM")
    report.unplaced_keys = sorted(unplaced)
    skip = set(model.lora_parameters()) if merge_lora else set()  # a fresh adapter is not an unset import
    report.unset_parameters = sorted(n for n in module_params if n not in targets and n not in skip)
    report.known_unused.sort()
    report.placed = len(targets)
    logger.info("official MLLM import from %s: %s", source, report.summary())
    for line in report.notes:
        logger.info("official MLLM import: %s", line)
    return report


def _merge(pairs, alpha, by_canonical, targets, unplaced, report) -> None:
    """Fold each official LoRA pair into the target value of its base weight."""
    merged = 0
    for module, ((key_a, a), (key_b, b)) in pairs.items():
        base_name = by_canonical.get(f"{module}.weight")
        base = targets.get(base_name) if base_name else None
        if base is None:
            unplaced += [key_a, key_b]
            report.notes.append(f"{module}: LoRA without a base weight to merge into")
            continue
        scale = alpha / a.shape[0]
        targets[base_name] = (base.float() + scale * (b.float() @ a.float())).to(base.dtype)
        merged += 1
    report.notes.append(f"merged {merged} LoRA pairs into the base weights (alpha {alpha:g} / r)")


def _place_lora(model, pairs, alpha, by_canonical, targets, unplaced, report) -> None:
    """Copy the official LoRA into the model's adapter, rescaling B when the adapter's alpha differs."""
    config = model.llm.peft_config[ADAPTER]
    model_scale = config.lora_alpha / config.r
    rescaled = False
    for module, ((key_a, a), (key_b, b)) in pairs.items():
        name_a, name_b = by_canonical.get(f"{module}.lora_A.weight"), by_canonical.get(f"{module}.lora_B.weight")
        if name_a is None or name_b is None:
            unplaced += [key_a, key_b]
            continue
        official_scale = alpha / a.shape[0]
        if abs(official_scale - model_scale) > 1e-12 * max(1.0, model_scale):
            b = b * (official_scale / model_scale)
            rescaled = True
        targets[name_a], targets[name_b] = a, b
    if rescaled:
        report.notes.append(f"LoRA B rescaled from official alpha {alpha:g} / r to the adapter's "
                            f"{config.lora_alpha:g} / {config.r}")
