"""What a save keeps, gathered out of FSDP shards one unit at a time.

A checkpoint and an export keep only what trains (a few hundred MB; phase (c)'s export adds its
frozen encoder), yet FSDP's full state dict and ``summon_full_params`` unshard the whole model at
once: copying a 7B float32 model to host memory on every rank makes each save cost the time of
about a hundred training steps, and gathering it on one GPU instead nearly doubles that rank's peak
memory (measured: benchmarks/README.md, 'Numbers behind comments').

Here each FSDP unit (a transformer block, or the root's own weights) is unsharded on its own, and only
when it holds something kept: every rank joins the unit's all-gather, ranks other than 0 free it at
once (``rank0_only``), and rank 0 copies just the kept tensors to the host before the unit is
resharded. The extra device memory is the largest gathered unit, often the root (phase (b): the
float32 embeddings and LM head, about 1 GB), for a moment.
"""
from __future__ import annotations

from typing import Callable, Iterator

import torch
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel

from animegamer.utils.state import FSDP_PREFIX, clean_name

def _own_params(module: nn.Module, prefix: str) -> Iterator[tuple[str, nn.Parameter]]:
    """The parameters of ``module``'s tree outside nested FSDP units: those its unit manages."""
    for name, param in module.named_parameters(recurse=False):
        yield prefix + name, param
    for name, child in module.named_children():
        if not isinstance(child, FullyShardedDataParallel):
            yield from _own_params(child, f"{prefix}{name}.")


def fsdp_units(root: nn.Module) -> list[tuple[nn.Module, list[tuple[str, nn.Parameter]]]]:
    """Every FSDP unit under ``root`` (root first) with its parameters under their clean full names."""
    units = []
    for path, unit in root.named_modules():
        if isinstance(unit, FullyShardedDataParallel):
            prefix = clean_name(f"{path}.{FSDP_PREFIX}" if path else FSDP_PREFIX)
            units.append((unit, list(_own_params(unit.module, prefix))))
    return units


def gathered_state(root: nn.Module, rank: int, keep: Callable[[str, nn.Parameter], bool]) -> dict[str, torch.Tensor]:
    """Rank 0: the whole parameters ``keep(name, param)`` selects, on the host, under the names of FSDP's
    full state dict; other ranks: empty. A collective: every rank calls it with the same ``keep``."""
    state: dict[str, torch.Tensor] = {}
    for index, (unit, params) in enumerate(fsdp_units(root)):
        wanted = [(name, param) for name, param in params if keep(name, param)]
        # The root unit is always entered first: unsharding it initialises the whole FSDP tree as a
        # forward would, which a nested unit entered first would get wrong (it would act as a root).
        if not wanted and index > 0:
            continue
        with FullyShardedDataParallel.summon_full_params(unit, recurse=False, writeback=False, rank0_only=True):
            if rank == 0:
                # copy=True: the unsharded storage is released when the unit is resharded
                state.update((name, param.detach().to("cpu", copy=True)) for name, param in wanted)
    return state


def saved_by(module: nn.Module) -> Callable[[str, nn.Parameter], bool]:
    """What a phase's saves keep: what trains (``requires_grad``, and the phase's ``trainable`` names,
    which its ``on_save_checkpoint`` keeps) and the parameters under its ``export_extra`` prefixes
    (relative to its ``model``; phase (c)'s export carries its frozen encoder)."""
    trained = {f"model.{name}" for name in getattr(module, "trainable", ())}
    extra = tuple(f"model.{prefix}" for prefix in getattr(module, "export_extra", ()))
    return lambda name, param: param.requires_grad or name in trained or name.startswith(extra)
