"""Two gloo ranks on CPU wrap the tiny phase (b) model with FSDP, as the ``fsdp`` preset does, and check
``animegamer.training.fsdp_gather``; tests/test_fsdp_gather.py runs it in a subprocess and reads
``rank<R>.json`` from the folder given as the only argument.

Lightning refuses FSDP on CPU, so torch's FSDP wraps a holder module with the phase's ``model.``
prefix directly: the names are those of the LightningModule's full state dict.
"""
from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

WORLD = 2


# A frozen weight inside a nested unit that the export keeps anyway (as phase (c) keeps its encoder).
EXTRA = "llm.base_model.model.model.layers.0.self_attn.q_proj.base_layer."


class Holder(nn.Module):
    """A LightningModule's shape: the network under ``model``, export prefixes in ``export_extra``."""
    export_extra = (EXTRA,)

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model


def _build() -> tuple[nn.Module, object]:
    from omegaconf import OmegaConf
    from test_mllm_model import _model, _randomize

    from animegamer.config.compose import compose_config
    from animegamer.mllm.tokens import TokenIds, add_animegamer_tokens, byte_tokenizer

    model_cfg = OmegaConf.to_object(compose_config("pipeline", ["model=tiny"]).model)
    tokenizer = byte_tokenizer()
    add_animegamer_tokens(tokenizer)
    model = _model(model_cfg, (tokenizer, TokenIds.from_tokenizer(tokenizer)), lora_dropout=0.0)
    _randomize(model)  # LoRA B is zero at init: give every weight a value of its own
    return Holder(model), tokenizer


def _max_diff(found: dict, expected: dict) -> float:
    return max((float((found[k] - expected[k]).abs().max()) for k in expected if k in found), default=float("inf"))


def _export(model: nn.Module, tokenizer, folder: Path, state: dict | None) -> dict:
    """Phase (b)'s export of ``model`` (from ``state`` when given): every file's tensors, by file."""
    from safetensors.torch import load_file

    from animegamer.phases.phase_b import export_phase_b

    export_phase_b(SimpleNamespace(model=model, tokenizer=tokenizer), folder, {}, state)
    return {str(f.relative_to(folder)): load_file(str(f)) for f in sorted(folder.rglob("*.safetensors"))}


def _rank(rank: int, port: int, out: Path) -> None:
    from torch.distributed.fsdp import FullStateDictConfig, FullyShardedDataParallel, StateDictType
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy
    from transformers.models.mistral.modeling_mistral import MistralDecoderLayer

    from animegamer.training.callbacks import model_state
    from animegamer.training.fsdp_gather import fsdp_units, gathered_state, saved_by

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    torch.manual_seed(0)
    holder, tokenizer = _build()
    reference = {n: p.detach().clone() for n, p in holder.named_parameters()}
    kept = sorted(n for n, p in holder.named_parameters() if p.requires_grad or n.startswith("model." + EXTRA))
    expected_export = _export(holder.model, tokenizer, out / f"reference{rank}", None) if rank == 0 else {}
    root = FullyShardedDataParallel(holder, device_id=torch.device("cpu"), use_orig_params=True,
                                    auto_wrap_policy=ModuleWrapPolicy({MistralDecoderLayer}))
    local_numel = sum(p.numel() for p in root.parameters())

    calls = []
    summon = FullyShardedDataParallel.summon_full_params

    def recording(module, **kwargs):  # what gathered_state unshards, and how
        calls.append((sum(p.numel() for p in module.parameters()), kwargs.get("recurse", True)))
        return summon(module, **kwargs)

    FullyShardedDataParallel.summon_full_params = recording
    state = gathered_state(root, rank, saved_by(holder))
    FullyShardedDataParallel.summon_full_params = summon
    with FullyShardedDataParallel.state_dict_type(root, StateDictType.FULL_STATE_DICT,
                                                  FullStateDictConfig(rank0_only=True)):
        full = root.state_dict()  # what Lightning's FSDP strategy saved before
    export = _export(holder.model, tokenizer, out / "gathered", model_state(state)) if rank == 0 else {}
    report = {
        "rank": rank, "kept": len(kept), "total_numel": sum(t.numel() for t in reference.values()),
        "local_numel": local_numel, "after_numel": sum(p.numel() for p in root.parameters()),
        "units": len(fsdp_units(root)), "calls": calls,
        "state_keys": sorted(state), "kept_keys": kept if rank == 0 else [],
        "full_has_kept": all(k in full for k in kept) if rank == 0 else None,
        "state_vs_reference": _max_diff(state, reference), "state_vs_full": _max_diff(state, full),
        "state_on_cpu": all(t.device.type == "cpu" for t in state.values()),
        "export_files": sorted(export), "expected_files": sorted(expected_export),
        "export_keys_equal": all(export[f].keys() == expected_export[f].keys() for f in expected_export) if export else None,
        "export_vs_reference": max((_max_diff(export[f], expected_export[f]) for f in expected_export), default=None),
    }
    (out / f"rank{rank}.json").write_text(json.dumps(report))
    dist.destroy_process_group()


def main(out: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_rank, args=(port, out), nprocs=WORLD)


if __name__ == "__main__":
    here = Path(__file__).resolve().parent
    sys.path[:0] = [str(here), str(here.parent / "src")]
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main(Path(sys.argv[1]))
