"""LoRA of both trained networks (the decoder's transformer and the MLLM's LLM) through peft.

One adapter, named :data:`ADAPTER`, per network; its folder is peft's own layout (weights + config),
so peft and diffusers load it as well. A network that carries LoRA exposes ``peft_module`` (the
module peft adapts), ``has_lora``, ``add_lora(config)`` and ``lora_config(rank, alpha, targets)``;
the functions here do the rest for both:

- :func:`inject` / :func:`wrap` add the adapter: inside a diffusers model in place (parameter names
  keep their module paths), or as peft's wrapper around a transformers model (the names the official
  MLLM checkpoint uses);
- :func:`merge_in_place` / :func:`merge_and_unwrap` fold it into the base weights for frozen use;
- :func:`save_adapter` / :func:`load_adapter` write and read the folder.
"""
from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Mapping, Optional

import torch
from torch import nn

from animegamer.checkpoints.safe_load import load_safetensors
from animegamer.utils.io import save_tensors
from animegamer.utils.state import peft_adapter_state

if TYPE_CHECKING:  # peft loads only where an adapter is built
    from peft import LoraConfig

ADAPTER = "default"  # peft's adapter name, as in the official checkpoints; stripped from saved keys
WEIGHTS_FILE = "adapter_model.safetensors"
CONFIG_FILE = "adapter_config.json"
MARKERS = (".lora_A.", ".lora_B.")
PEFT_BASE = ".base_layer."  # where peft moves the tensors of a Linear it wraps


def is_lora_name(name: str) -> bool:
    """Whether a parameter (or state-dict key) name is one of the LoRA matrices."""
    return any(marker in f".{name}" for marker in MARKERS)


def lora_names(module: nn.Module) -> list[str]:
    """Names of the LoRA matrices among ``module``'s parameters (empty without an adapter)."""
    return [name for name, _ in module.named_parameters() if is_lora_name(name)]


def has_adapter(peft_module: nn.Module) -> bool:
    return ADAPTER in getattr(peft_module, "peft_config", {})


def make_config(cfg, rank: Optional[int] = None, alpha: Optional[float] = None,
                targets: Optional[Iterable[str]] = None, dropout: float = 0.0, **extra) -> "LoraConfig":
    """peft LoraConfig (scaling alpha / r, B = 0 at init, so adding it leaves the output unchanged).

    ``cfg`` is the network's config (``lora_rank``, ``lora_alpha``, ``lora_targets``): it fills the
    fields left unset. ``extra`` passes further LoraConfig fields (the MLLM's ``task_type``)."""
    from peft import LoraConfig

    return LoraConfig(r=rank or cfg.lora_rank, lora_alpha=alpha if alpha is not None else cfg.lora_alpha,
                      lora_dropout=dropout, target_modules=sorted(targets or cfg.lora_targets), bias="none",
                      init_lora_weights=True, **extra)


def inject(module: nn.Module, config: "LoraConfig") -> None:
    """Add the adapter inside a diffusers model (its ``add_adapter``: peft's injection plus diffusers'
    bookkeeping). peft freezes every other parameter as it injects; the previous flags are restored,
    so what trains stays the caller's decision, and the new LoRA matrices train."""
    flags = {name: param.requires_grad for name, param in module.named_parameters()}
    module.add_adapter(config, adapter_name=ADAPTER)
    for name, param in module.named_parameters():
        param.requires_grad_(flags.get(name.replace(PEFT_BASE, "."), True))


def wrap(model: nn.Module, config: "LoraConfig") -> nn.Module:
    """peft's wrapper with the adapter around a transformers model; the adapter takes the model's dtype
    (mixed precision is the trainer's business)."""
    from peft import get_peft_model

    with warnings.catch_warnings():  # peft reads transformers' deprecated is_gradient_checkpointing
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        return get_peft_model(model, config, adapter_name=ADAPTER, autocast_adapter_dtype=False)


def merge_in_place(module: nn.Module) -> None:
    """Fold an injected adapter into its base Linears (W + alpha / r * B A): they then run alone, one
    matmul instead of three, and parameter names do not change."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    for layer in module.modules():
        if isinstance(layer, BaseTunerLayer) and not layer.merged:
            layer.merge(adapter_names=[ADAPTER])


def merge_and_unwrap(model: nn.Module) -> nn.Module:
    """Fold a wrapped adapter into the base weights and return the plain model peft wrapped."""
    return model.merge_and_unload()


def save_adapter(peft_module: nn.Module, folder: str | Path, names: Iterable[str],
                 state: Mapping[str, torch.Tensor] | None = None, prefix: str = "", **peft_kwargs) -> Path:
    """Write ``peft_module``'s adapter as a peft folder (weights + config).

    ``names``: the LoRA parameters that must be saved. ``state``: whole tensors gathered elsewhere (FSDP
    saves) under ``prefix`` + the module's parameter names, read instead of the (sharded) parameters.
    ``peft_kwargs`` go to peft's ``get_peft_model_state_dict``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = peft_adapter_state(peft_module, ADAPTER, state, prefix, names, **peft_kwargs)
    save_tensors({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, folder / WEIGHTS_FILE)
    peft_module.peft_config[ADAPTER].save_pretrained(str(folder))
    return folder


def holds_adapter(folder: str | Path) -> bool:
    return (Path(folder) / CONFIG_FILE).is_file()


def load_adapter(network: nn.Module, folder: str | Path, label: str) -> None:
    """Fill ``network``'s adapter from a peft folder, adding it (the folder's rank, alpha and targets)
    when the network has none.

    Rank and alpha must match, every LoRA tensor must be filled and no stray key is accepted: a
    silently partial LoRA would look like a trained model and behave like an untrained one. ``label``
    names the network in errors."""
    from peft import set_peft_model_state_dict

    folder = Path(folder)
    saved = json.loads((folder / CONFIG_FILE).read_text())
    if not network.has_lora:
        network.add_lora(network.lora_config(rank=saved["r"], alpha=saved["lora_alpha"],
                                             targets=saved.get("target_modules")))
    current = network.peft_module.peft_config[ADAPTER]
    if (saved["r"], saved["lora_alpha"]) != (current.r, current.lora_alpha):
        raise ValueError(f"adapter in {folder} has rank {saved['r']} / alpha {saved['lora_alpha']}, the "
                         f"{label}'s has rank {current.r} / alpha {current.lora_alpha}")
    result = set_peft_model_state_dict(network.peft_module, load_safetensors(folder / WEIGHTS_FILE),
                                       adapter_name=ADAPTER)
    missing = [key for key in result.missing_keys if is_lora_name(key)]
    if result.unexpected_keys or missing:
        raise ValueError(f"LoRA in {folder} does not fit the {label}: unexpected "
                         f"{list(result.unexpected_keys)}, missing {missing}")
