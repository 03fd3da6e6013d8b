"""Two gloo ranks on CPU wrap a tiny phase network with FSDP, as the ``fsdp`` preset does, and check
``animegamer.training.fsdp_gather``: the gathered state, the export written from it, and the
checkpoint round trip through Lightning's loader. tests/test_fsdp_gather.py runs
``python tests/fsdp_gather_driver.py OUT PHASE...`` (each PHASE ``b`` or ``c``) and reads
``OUT/PHASE/rank<R>.json``.

The ranks are forked once the driver has imported what they use (the import, not the check, is most of a
rank's time), and check the phases one after the other, each in a process group of its own. The ranks
meet through a file in OUT/PHASE (no port to pick and release), and end each group as training runs end
(``animegamer.training.process_group.end_process_group``): the report says how many of gloo's threads
are still alive afterwards, which must be none (a live worker can abort the interpreter's exit).

Lightning refuses FSDP on CPU, so torch's FSDP wraps the LightningModule (phase (c)) or a holder of
the phase (b) network under ``model`` directly: the names are those of the LightningModule's full
state dict.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

WORLD = 2
RENDEZVOUS = "rendezvous"  # the FileStore's file in OUT
# Threads of a gloo group (its workers, its transport's event loop) and of a TCP store's server.
GLOO_THREADS = ("pt_gloo_runloop", "gloo_tcp_loop", "pt_tcpstore_uv")
# Phase (b): a frozen weight inside a nested unit that the export keeps anyway, as phase (c) keeps its
# (root-unit) encoder.
EXTRA_B = "llm.base_model.model.model.layers.0.self_attn.q_proj.base_layer."


class Holder(nn.Module):
    """A LightningModule's shape: the network under ``model``, export prefixes in ``export_extra``."""
    export_extra = (EXTRA_B,)

    def __init__(self, model: nn.Module, tokenizer) -> None:
        super().__init__()
        self.model, self.tokenizer = model, tokenizer
        self.trainable = [n for n, p in model.named_parameters() if p.requires_grad]


def _phase_b(seed: int):
    from omegaconf import OmegaConf
    from test_mllm_model import _model, _randomize
    from transformers.models.mistral.modeling_mistral import MistralDecoderLayer

    from animegamer.config.compose import compose_config
    from animegamer.mllm.tokens import TokenIds, add_animegamer_tokens, byte_tokenizer
    from animegamer.phases.phase_b import export_phase_b

    torch.manual_seed(seed)
    model_cfg = OmegaConf.to_object(compose_config("pipeline", ["model=tiny"]).model)
    tokenizer = byte_tokenizer()
    add_animegamer_tokens(tokenizer)
    model = _model(model_cfg, (tokenizer, TokenIds.from_tokenizer(tokenizer)), lora_dropout=0.0)
    _randomize(model)  # LoRA B is zero at init: give every weight a value of its own
    return Holder(model, tokenizer), MistralDecoderLayer, export_phase_b


def _phase_c(seed: int):
    from diffusers.models.transformers.cogvideox_transformer_3d import CogVideoXBlock
    from omegaconf import OmegaConf

    from animegamer.config.compose import compose_config
    from animegamer.phases.phase_c import PhaseC, export_phase_c

    cfg = OmegaConf.to_object(compose_config("train", ["model=tiny", "phase=c", "pipeline.clips.height=32",
                                                        "pipeline.clips.width=48"]))
    torch.manual_seed(seed)
    module = PhaseC(cfg)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn_like(p) * 0.01)
    return module, CogVideoXBlock, export_phase_c


PHASES = {"b": _phase_b, "c": _phase_c}


def _max_diff(found: dict, expected: dict) -> float:
    return max((float((found[k] - expected[k]).abs().max()) for k in expected if k in found), default=float("inf"))


def _files(folder: Path) -> dict:
    from safetensors.torch import load_file

    return {str(f.relative_to(folder)): load_file(str(f)) for f in sorted(folder.rglob("*.safetensors"))}


def _wrap(module: nn.Module, block: type) -> nn.Module:
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    return FullyShardedDataParallel(module, device_id=torch.device("cpu"), use_orig_params=True,
                                    auto_wrap_policy=ModuleWrapPolicy({block}))


def _recording_summons(calls: list):
    """Patch FSDP's summon_full_params to record what is unsharded and how; returns the original."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    summon = FullyShardedDataParallel.summon_full_params

    def recording(module, **kwargs):
        calls.append((sum(p.numel() for p in module.parameters()), kwargs.get("recurse", True)))
        return summon(module, **kwargs)

    FullyShardedDataParallel.summon_full_params = recording
    return summon


def gloo_threads() -> int:
    """How many of this process's threads are gloo's or a TCP store's (Linux: the threads' names)."""
    tasks = Path("/proc/self/task")
    return sum((task / "comm").read_text().strip() in GLOO_THREADS for task in tasks.iterdir())


def _rank(rank: int, out: Path, phases: list[str]) -> None:
    from animegamer.training.process_group import end_process_group

    for phase in phases:
        folder = out / phase
        dist.init_process_group("gloo", init_method=(folder / RENDEZVOUS).as_uri(), rank=rank, world_size=WORLD)
        report = _check(rank, folder, phase)  # its FSDP wrappers are garbage once it returns
        end_process_group(synchronize=True)
        report["gloo_threads_after_teardown"] = gloo_threads()
        (folder / f"rank{rank}.json").write_text(json.dumps(report))


def _check(rank: int, out: Path, phase: str) -> dict:
    from lightning.fabric.strategies.model_parallel import _load_raw_module_state
    from torch.distributed.fsdp import FullStateDictConfig, FullyShardedDataParallel, StateDictType

    from animegamer.phases.common import keep_trained
    from animegamer.training.callbacks import model_state
    from animegamer.training.fsdp_gather import fsdp_units, gathered_state, saved_by

    module, block, export_fn = PHASES[phase](seed=0)
    reference = {n: p.detach().clone() for n, p in module.named_parameters()}
    keep = saved_by(module)
    kept = sorted(n for n, p in module.named_parameters() if keep(n, p))
    if rank == 0:
        export_fn(module, out / "reference", {})
    root = _wrap(module, block)
    local_numel = sum(p.numel() for p in root.parameters())

    calls: list = []
    summon = _recording_summons(calls)
    state = gathered_state(root, rank, keep)
    FullyShardedDataParallel.summon_full_params = summon
    with FullyShardedDataParallel.state_dict_type(root, StateDictType.FULL_STATE_DICT,
                                                  FullStateDictConfig(rank0_only=True)):
        full = root.state_dict()  # what Lightning's FSDP strategy saved before
    if rank == 0:
        export_fn(module, out / "gathered", {}, state=model_state(state))
        checkpoint = {"state_dict": dict(state)}
        keep_trained(checkpoint, module.trainable)  # what the phase's on_save_checkpoint leaves
        torch.save(checkpoint["state_dict"], out / "checkpoint.pt")
    dist.barrier()

    # Resume as Lightning's FSDP strategy loads a full checkpoint: every rank reads it into a fresh,
    # differently seeded model (frozen weights come from the config, not the file).
    saved = torch.load(out / "checkpoint.pt", weights_only=True)
    fresh, _, _ = PHASES[phase](seed=1)
    fresh_root = _wrap(fresh, block)
    _load_raw_module_state(saved, module=fresh_root, world_size=WORLD, strict=False)
    reloaded = gathered_state(fresh_root, rank, saved_by(fresh))

    expected, found = (_files(out / side) for side in ("reference", "gathered")) if rank == 0 else ({}, {})
    return {
        "rank": rank, "kept": len(kept), "total_numel": sum(t.numel() for t in reference.values()),
        "local_numel": local_numel, "after_numel": sum(p.numel() for p in root.parameters()),
        "units": len(fsdp_units(root)), "calls": calls,
        "state_keys": sorted(state), "kept_keys": kept if rank == 0 else [],
        "full_has_kept": all(k in full for k in kept) if rank == 0 else None,
        "state_vs_reference": _max_diff(state, reference), "state_vs_full": _max_diff(state, full),
        "state_on_cpu": all(t.device.type == "cpu" for t in state.values()),
        "export_files": sorted(found), "expected_files": sorted(expected),
        "export_keys_equal": all(found[f].keys() == expected[f].keys() for f in expected) if found else None,
        "export_vs_reference": max((_max_diff(found[f], expected[f]) for f in expected), default=None),
        "checkpoint_keys": len(saved), "trainable": len(module.trainable),
        "resumed_vs_checkpoint": _max_diff(reloaded, saved) if rank == 0 else None,
    }


def _import_what_ranks_use() -> None:
    """Before the fork: no rank imports anything of its own (importing starts no thread to fork)."""
    import diffusers.models.transformers.cogvideox_transformer_3d  # noqa: F401
    import lightning.fabric.strategies.model_parallel  # noqa: F401
    import test_mllm_model  # noqa: F401
    import torch.distributed.fsdp  # noqa: F401
    import transformers.models.mistral.modeling_mistral  # noqa: F401

    import animegamer.config.compose  # noqa: F401
    import animegamer.mllm.tokens  # noqa: F401
    import animegamer.phases.common  # noqa: F401
    import animegamer.phases.phase_b  # noqa: F401
    import animegamer.phases.phase_c  # noqa: F401
    import animegamer.training.callbacks  # noqa: F401
    import animegamer.training.fsdp_gather  # noqa: F401
    import animegamer.training.process_group  # noqa: F401


def main(out: Path, phases: list[str]) -> None:
    for phase in phases:
        (out / phase).mkdir(parents=True, exist_ok=True)
        (out / phase / RENDEZVOUS).unlink(missing_ok=True)  # a FileStore's file must be new
    _import_what_ranks_use()
    mp.start_processes(_rank, args=(out, phases), nprocs=WORLD, start_method="fork")


if __name__ == "__main__":
    here = Path(__file__).resolve().parent
    sys.path[:0] = [str(here), str(here.parent / "src")]
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main(Path(sys.argv[1]), sys.argv[2:])
