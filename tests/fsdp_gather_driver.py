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

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

WORLD = 2


class Holder(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model


def _build() -> nn.Module:
    from omegaconf import OmegaConf
    from test_mllm_model import _model, _randomize

    from animegamer.config.compose import compose_config
    from animegamer.mllm.tokens import TokenIds, add_animegamer_tokens, byte_tokenizer

    model_cfg = OmegaConf.to_object(compose_config("pipeline", ["model=tiny"]).model)
    tokenizer = byte_tokenizer()
    add_animegamer_tokens(tokenizer)
    model = _model(model_cfg, (tokenizer, TokenIds.from_tokenizer(tokenizer)), lora_dropout=0.0)
    _randomize(model)  # LoRA B is zero at init: give every weight a value of its own
    return Holder(model)


def _max_diff(found: dict, expected: dict) -> float:
    return max((float((found[k] - expected[k]).abs().max()) for k in expected if k in found), default=float("inf"))


def _rank(rank: int, port: int, out: Path) -> None:
    from torch.distributed.fsdp import FullStateDictConfig, FullyShardedDataParallel, StateDictType
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy
    from transformers.models.mistral.modeling_mistral import MistralDecoderLayer

    from animegamer.training.fsdp_gather import trained_full_state, whole_params

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    torch.manual_seed(0)
    holder = _build()
    reference = {n: p.detach().clone() for n, p in holder.named_parameters()}
    trainable = sorted(n for n, p in holder.named_parameters() if p.requires_grad)
    root = FullyShardedDataParallel(holder, device_id=torch.device("cpu"), use_orig_params=True,
                                    auto_wrap_policy=ModuleWrapPolicy({MistralDecoderLayer}))
    local_numel = sum(p.numel() for p in root.parameters())

    state = trained_full_state(root, WORLD, rank)
    with whole_params(root, WORLD):
        inside = {n: p.detach().clone() for n, p in root.named_parameters()}
    after_numel = sum(p.numel() for p in root.parameters())
    with FullyShardedDataParallel.state_dict_type(root, StateDictType.FULL_STATE_DICT,
                                                  FullStateDictConfig(rank0_only=True)):
        full = root.state_dict()  # what Lightning's FSDP strategy saved before
    report = {
        "rank": rank, "trainable": len(trainable), "total_numel": sum(t.numel() for t in reference.values()),
        "local_numel": local_numel, "after_numel": after_numel,
        "state_keys": sorted(state), "full_trainable_keys": sorted(k for k in full if k in set(trainable)),
        "state_vs_reference": _max_diff(state, reference), "state_vs_full": _max_diff(state, full),
        "state_on_cpu": all(t.device.type == "cpu" for t in state.values()),
        "inside_numel": sum(t.numel() for t in inside.values()),
        "inside_vs_reference": _max_diff(inside, reference) if rank == 0 else None,
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
