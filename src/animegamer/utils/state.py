"""Parameter names and state dicts shared by checkpoints, exports and sharded saves."""
from __future__ import annotations

from typing import Iterable, Mapping

import torch

FSDP_PREFIX = "_fsdp_wrapped_module."  # what FSDP inserts into the names of the modules it wraps


def clean_name(name: str) -> str:
    """A parameter's name as FSDP's full state dict writes it (the unwrapped module's name)."""
    return name.replace(FSDP_PREFIX, "")


def require(state: Mapping[str, torch.Tensor], names: Iterable[str]) -> None:
    """Every one of ``names`` (FSDP prefixes allowed) must be in ``state``: an export written from a
    partial state would look complete and load as untrained."""
    missing = [clean_name(name) for name in names if clean_name(name) not in state]
    if missing:
        raise KeyError(f"the gathered state lacks {len(missing)} tensors to save, e.g. {missing[:3]}")


def submodule_state(state: Mapping[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """The entries of ``state`` under ``prefix``, renamed relative to it (a submodule's state dict)."""
    return {name[len(prefix):]: tensor for name, tensor in state.items() if name.startswith(prefix)}


def peft_adapter_state(peft_model, adapter_name: str, state: Mapping[str, torch.Tensor] | None = None,
                       prefix: str = "", required: Iterable[str] = (), **kwargs) -> dict[str, torch.Tensor]:
    """peft's adapter state dict of ``peft_model``, from ``state`` when given, else from the model.

    ``state`` holds whole tensors (an FSDP save's gathered state) under clean names: ``prefix`` + the
    peft model's parameter names. peft finds adapter entries by the names of the model's modules,
    which FSDP's wrappers change, so the entries are handed to it under the model's own names and
    cleaned afterwards. ``required`` (clean or wrapped names in ``state``'s naming) must be present."""
    from peft import get_peft_model_state_dict  # seconds to import: only savers of adapters need it

    if state is None:
        return get_peft_model_state_dict(peft_model, adapter_name=adapter_name, **kwargs)
    require(state, required)
    own = {name: state[prefix + clean_name(name)] for name, _ in peft_model.named_parameters()
           if prefix + clean_name(name) in state}
    found = get_peft_model_state_dict(peft_model, state_dict=own, adapter_name=adapter_name, **kwargs)
    return {clean_name(name): tensor for name, tensor in found.items()}
