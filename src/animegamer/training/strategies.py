"""``trainer.strategy`` names -> Lightning strategy objects. Distribution is configuration only: the
phases and models never know which engine runs them.

Every strategy saves only what trains (frozen weights are rebuilt from the config on resume):
DDP and FSDP (full state dict) through the phases' ``on_save_checkpoint``, DeepSpeed through its
``exclude_frozen_parameters``. FSDP also gathers only what is kept, unit by unit (``fsdp_gather``):
copying the whole unsharded model to the host made a phase (b) save on 2 H200s take about 75 s.
"""
from __future__ import annotations

import contextlib
import logging
from contextlib import contextmanager
from typing import Callable, ContextManager

from animegamer.config.schema import RunConfig

log = logging.getLogger(__name__)

DDP_STRATEGIES = ("auto", "ddp", "ddp_spawn")
FSDP = "fsdp"
FSDP_SHARDINGS = ("FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD", "NO_SHARD")  # trainer.fsdp_sharding
FSDP_COMPUTE = ("autocast", "bf16")  # trainer.fsdp_compute
FSDP_INIT_DEVICES = ("cpu", "gpu")  # trainer.fsdp_init_device
# name -> (ZeRO stage, optimizer offload to CPU)
DEEPSPEED_STRATEGIES = {
    "deepspeed_stage_1": (1, False),
    "deepspeed_stage_2": (2, False),
    "deepspeed_stage_2_offload": (2, True),
    "deepspeed_stage_3": (3, False),
    "deepspeed_stage_3_offload": (3, True),
}
STRATEGIES = DDP_STRATEGIES + (FSDP,) + tuple(DEEPSPEED_STRATEGIES)


def block_types(cfg: RunConfig) -> set[type]:
    """The transformer block classes of the phase's trained network: FSDP's wrapping unit."""
    if cfg.phase.name == "b":
        from transformers.models.mistral.modeling_mistral import MistralDecoderLayer

        return {MistralDecoderLayer}
    from diffusers.models.transformers.cogvideox_transformer_3d import CogVideoXBlock

    return {CogVideoXBlock}


def make_strategy(cfg: RunConfig):
    """The Lightning strategy (object or name) of ``cfg.trainer.strategy``."""
    name = cfg.trainer.strategy
    if name not in STRATEGIES:
        raise ValueError(f"trainer.strategy={name!r}: expected one of {', '.join(STRATEGIES)}")
    if name in DDP_STRATEGIES:
        if name == "auto" or cfg.trainer.devices * cfg.trainer.num_nodes == 1:
            return name
        from lightning.pytorch.strategies import DDPStrategy

        # Frozen parameters are not registered by DDP (requires_grad=False), so every trained
        # parameter gets a gradient each step: no unused-parameter search needed.
        # gradient_as_bucket_view: gradients live in the all-reduce buckets (no copy, less memory).
        return DDPStrategy(start_method="spawn" if name == "ddp_spawn" else "popen", find_unused_parameters=False,
                           gradient_as_bucket_view=True)
    if name == FSDP:
        # use_orig_params: frozen and trained weights share a block's flat parameter (LoRA, AdaLN).
        # Full state dict: the phases' on_save_checkpoint then keeps only what trains.
        # forward_prefetch: the next block's all-gather is issued before this block's forward runs,
        # so the gathers overlap compute in the forward as backward_prefetch does in the backward.
        return trained_state_fsdp()(auto_wrap_policy=block_types(cfg), sharding_strategy=cfg.trainer.fsdp_sharding,
                            state_dict_type="full", use_orig_params=True, limit_all_gathers=True,
                            forward_prefetch=True, mixed_precision=fsdp_mixed_precision(cfg))
    from lightning.pytorch.strategies import DeepSpeedStrategy

    stage, offload = DEEPSPEED_STRATEGIES[name]
    return DeepSpeedStrategy(stage=stage, offload_optimizer=offload, offload_parameters=offload and stage == 3,
                             exclude_frozen_parameters=True, logging_level=logging.WARNING)


def trained_state_fsdp():
    """Lightning's FSDPStrategy whose full state dict holds only what the phase's saves keep.

    Lightning's unshards the whole model into rank 0's host memory, which the phases'
    ``on_save_checkpoint`` then mostly drops (frozen weights are rebuilt from the config); this one
    gathers unit by unit and copies only the kept tensors (``fsdp_gather``). The state also serves
    the export (``callbacks.ExportCallback``). Loading is Lightning's: a full state dict without the
    frozen keys, as before."""
    from lightning.pytorch.strategies import FSDPStrategy

    from animegamer.training.fsdp_gather import gathered_state, saved_by

    class TrainedStateFSDPStrategy(FSDPStrategy):
        def lightning_module_state_dict(self) -> dict:
            if self._state_dict_type != "full":
                return super().lightning_module_state_dict()
            return gathered_state(self.model, self.global_rank, saved_by(self.lightning_module))

    return TrainedStateFSDPStrategy


def module_init(cfg: RunConfig, trainer) -> Callable[[], ContextManager]:
    """The context the phase's networks are built in (``runner.build_phase``'s ``init``).

    Lightning builds on the GPU under every strategy but FSDP, which builds on the CPU so that a model
    larger than one GPU can still be sharded; a random or loaded 7B float32 model then takes the CPU a
    while (phase (b) FSDP launches started about 70 s later than ZeRO-2 ones on an H200 host; not
    profiled). ``trainer.fsdp_init_device=gpu`` builds each rank's whole model on its GPU first, as the
    other strategies do, for models whose weights fit one GPU in the precision's dtype (float32 under
    bf16-mixed).
    """
    if cfg.trainer.accelerator == "cpu":
        return contextlib.nullcontext
    if cfg.trainer.strategy == FSDP and cfg.trainer.fsdp_init_device == "gpu":
        return lambda: _on_root_device(trainer)
    return lambda: trainer.init_module(empty_init=False)


def _on_root_device(trainer):
    """What every other Lightning strategy builds in: its device and its precision's dtype."""
    from lightning.pytorch.strategies import Strategy

    return Strategy.tensor_init_context(trainer.strategy, empty_init=False)


def fsdp_mixed_precision(cfg: RunConfig):
    """FSDP's MixedPrecision for ``trainer.fsdp_compute=bf16`` (None: Lightning's, from the precision).

    Each unit's weights are gathered in bf16 and the root's floating inputs cast to bf16, so weights
    and activations compute in bf16 as under DeepSpeed's bf16 mode; the sharded float32 parameters are
    the optimizer's master weights, and gradients are reduced and kept in float32."""
    if cfg.trainer.strategy != FSDP or cfg.trainer.fsdp_compute != "bf16":
        return None
    import torch
    from torch.distributed.fsdp import MixedPrecision

    return MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32, buffer_dtype=torch.bfloat16)


def lightning_precision(cfg: RunConfig) -> str:
    """The Trainer's precision: "32-true" when FSDP's own MixedPrecision does the casting (Lightning's
    bf16-mixed would add autocast on top, with the float32 activation copies this mode avoids)."""
    return "32-true" if fsdp_mixed_precision(cfg) is not None else cfg.trainer.precision


def is_deepspeed(name: str) -> bool:
    return name in DEEPSPEED_STRATEGIES


def is_fsdp_strategy(strategy) -> bool:
    """Lightning's FSDP strategy, ours (``trained_state_fsdp``) included."""
    from lightning.pytorch.strategies import FSDPStrategy

    return isinstance(strategy, FSDPStrategy)


@contextmanager
def full_weights(trainer):
    """Inside, the module's parameters are whole (ZeRO-3 partitions are gathered), so an export reads
    full tensors. A collective: every rank must enter. FSDP exports read the gathered state instead
    (``callbacks.ExportCallback``)."""
    strategy = trainer.strategy
    if type(strategy).__name__ == "DeepSpeedStrategy" and strategy.zero_stage_3:
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(trainer.lightning_module.parameters()), modifier_rank=None):
            yield
    else:
        yield


def checkpoint_safe_globals(name: str) -> list:
    """Classes a DeepSpeed checkpoint pickles besides tensors, allowed when checking a resume."""
    if not is_deepspeed(name):
        return []
    import importlib

    found = []
    for module, attr in DEEPSPEED_PICKLED:
        try:
            found.append(getattr(importlib.import_module(module), attr))
        except (ImportError, AttributeError):
            log.debug("no %s.%s in this DeepSpeed", module, attr)
    return found


DEEPSPEED_PICKLED = (
    ("deepspeed.runtime.fp16.loss_scaler", "LossScaler"),
    ("deepspeed.runtime.fp16.loss_scaler", "DynamicLossScaler"),
    ("deepspeed.runtime.zero.config", "ZeroStageEnum"),
    ("deepspeed.utils.tensor_fragment", "fragment_address"),
)
