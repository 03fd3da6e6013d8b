"""What both official importers (decoder and MLLM) share: the report of what an import left undone,
and the final copy of the mapped tensors into the module's parameters."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Mapping

import torch


@dataclass
class ImportReport:
    """What an import did not do; empty lists mean the modules now hold the official network."""

    unplaced_keys: List[str] = field(default_factory=list)  # official keys (prefix stripped)
    unset_parameters: List[str] = field(default_factory=list)  # module parameter names
    known_unused: List[str] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)
    placed: int = 0

    @property
    def ok(self) -> bool:
        return not self.unplaced_keys and not self.unset_parameters

    def summary(self) -> str:
        return (f"placed {self.placed} tensors; unplaced official keys {len(self.unplaced_keys)}, unset module "
                f"parameters {len(self.unset_parameters)}, known-unused {len(self.known_unused)}")


def copy_into(params: Mapping[str, torch.Tensor], targets: Mapping[str, torch.Tensor], network: str) -> None:
    """Copy each target value into its parameter (cast to the parameter's dtype and device), refusing
    any shape mismatch with the full list first, so a wrong size never leaves a half-copied network.
    ``network`` names the checkpoint in the error."""
    wrong = [f"{n}: module {tuple(params[n].shape)} vs official {tuple(v.shape)}"
             for n, v in targets.items() if params[n].shape != v.shape]
    if wrong:
        raise ValueError(f"official {network} tensors do not fit the configured sizes: " + "; ".join(wrong))
    with torch.no_grad():
        for name, value in targets.items():
            params[name].copy_(value.to(dtype=params[name].dtype, device=params[name].device))
