"""``trainer.strategy`` names -> Lightning strategy objects. Distribution is configuration: models never
know which engine runs them, and phases know it in one place, gradient clipping (``clip_gradients``),
because FSDP shards the gradients and only its root module can compute their global norm, and
DeepSpeed's engine clips and skips steps itself (``rule_keeping_deepspeed``).

Every strategy saves only what trains (frozen weights are rebuilt from the config on resume):
DDP and FSDP (full state dict) through the phases' ``on_save_checkpoint``, DeepSpeed through its
``exclude_frozen_parameters``. FSDP also gathers only what is kept, unit by unit (``fsdp_gather``),
instead of copying the whole unsharded model to the host at every save.
"""
from __future__ import annotations

import contextlib
import logging
from contextlib import contextmanager
from typing import Callable, ContextManager

from animegamer.config.schema import RunConfig
from animegamer.config.validate import choice
from animegamer.errors import UserError
from animegamer.training import fsdp_gather
from animegamer.training.nonfinite import count_step

log = logging.getLogger(__name__)
# Lightning's strategies, DeepSpeed and the network libraries are imported inside the functions that make
# or inspect a strategy: the validation pass imports this module for its choices and checks.

DDP_STRATEGIES = ("auto", "ddp", "ddp_spawn")
FSDP = "fsdp"
FSDP_SHARDINGS = ("FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD", "NO_SHARD")  # trainer.fsdp_sharding
FSDP_BF16_COMPUTE, FSDP_GPU_INIT = "bf16", "gpu"
FSDP_COMPUTE = ("autocast", FSDP_BF16_COMPUTE)  # trainer.fsdp_compute
FSDP_INIT_DEVICES = ("cpu", FSDP_GPU_INIT)  # trainer.fsdp_init_device
# name -> (ZeRO stage, optimizer offload to CPU)
DEEPSPEED_STRATEGIES = {
    "deepspeed_stage_1": (1, False),
    "deepspeed_stage_2": (2, False),
    "deepspeed_stage_2_offload": (2, True),
    "deepspeed_stage_3": (3, False),
    "deepspeed_stage_3_offload": (3, True),
}
STRATEGIES = DDP_STRATEGIES + (FSDP,) + tuple(DEEPSPEED_STRATEGIES)
ZERO3_STAGE = 3  # the stage that partitions the parameters themselves
# The DeepSpeed whose ZeRO-1/2 were seen to skip a step with NaN/inf gradients in float32 and, with
# check_grad_overflow, in bf16 (tests/test_deepspeed.py). In 0.19.0's source float32 still applies such
# a step and 0.16.9 has no bf16 check; the versions between were not read. Also the lower bound of
# setup.cfg's [distributed] extra.
DEEPSPEED_MIN_VERSION = "0.19.8"
DEEPSPEED_CLIP_KEY, DEEPSPEED_BF16_KEY, DEEPSPEED_OVERFLOW_KEY = "gradient_clipping", "bf16", "check_grad_overflow"
LIGHTNING_CLIP_WARNING = "Since DeepSpeed handles gradient clipping internally"
PARTITIONED_STAGE = 3  # the ZeRO stage that partitions the parameters themselves
BF16_MIXED = "bf16-mixed"  # Lightning's autocast precision
KNOWN_PRECISIONS = ("transformer-engine", "transformer-engine-float16", "16-true", "16-mixed", "bf16-true",
                    BF16_MIXED, "32-true", "64-true", "64", "32", "16", "bf16")  # Lightning's names
DEEPSPEED_PRECISIONS = ("32-true", "16-true", "bf16-true", "16-mixed", BF16_MIXED)  # Lightning's DeepSpeed plugin


def make_strategy(cfg: RunConfig, block_types: Callable[[], set[type]]):
    """The Lightning strategy (object or name) of ``cfg.trainer.strategy``. ``block_types``: the transformer
    block classes of the trained network, FSDP's wrapping unit (called under FSDP only: it imports them)."""
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
        return trained_state_fsdp()(auto_wrap_policy=block_types(), sharding_strategy=cfg.trainer.fsdp_sharding,
                            state_dict_type="full", use_orig_params=True, limit_all_gathers=True,
                            forward_prefetch=True, mixed_precision=fsdp_mixed_precision(cfg))
    require_deepspeed(name)
    stage, offload = DEEPSPEED_STRATEGIES[name]
    return rule_keeping_deepspeed()(cfg.phase.grad_clip, cfg.trainer.max_nonfinite_in_row, stage=stage,
                                    offload_optimizer=offload, offload_parameters=offload and stage == ZERO3_STAGE,
                                    exclude_frozen_parameters=True, logging_level=logging.WARNING)


def require_deepspeed(name: str) -> None:
    """Refuse a DeepSpeed strategy when the installed DeepSpeed is missing or older than the one whose
    skipping of non-finite steps was verified (:data:`DEEPSPEED_MIN_VERSION`)."""
    from importlib.metadata import PackageNotFoundError, version

    from packaging.version import Version

    try:
        found = version("deepspeed")
    except PackageNotFoundError:
        found = None
    if found is None or Version(found) < Version(DEEPSPEED_MIN_VERSION):
        have = f"deepspeed {found} is installed" if found else "deepspeed is not installed"
        raise UserError(f"trainer.strategy={name!r} needs deepspeed>={DEEPSPEED_MIN_VERSION} and {have}: "
                        f"pip install -e '.[distributed]' (0.19.0 still applies a float32 ZeRO-1/2 step with "
                        f"NaN/inf gradients instead of skipping it)")


def rule_keeping_deepspeed():
    """Lightning's DeepSpeedStrategy under the framework's gradient rules.

    DeepSpeed clips and steps inside its engine, so the phases' ``configure_gradient_clipping``
    (:func:`~animegamer.phases.common.clip_gradients`) sees no gradients here and does nothing. This
    strategy gives the engine ``gradient_clipping = phase.grad_clip`` itself, turns on bf16's
    ``check_grad_overflow`` (ZeRO-1/2 in bf16 apply NaN/inf gradients without it; float32 and ZeRO-3
    skip on a non-finite norm regardless), and after each optimizer step counts the steps the engine
    skipped as non-finite (:func:`~animegamer.training.nonfinite.count_step`), so ``max_nonfinite_in_row``
    stops the run as under the other strategies. Every rank sees the same decision: the engine
    all-reduces the overflow flag and the norm. Under fp16 (``16-mixed``, ``16-true``) the dynamic loss
    scaler's skips are its way of finding the scale, not faults: they are left to DeepSpeed, which
    stops the run once the scale reaches its minimum."""
    import warnings

    from lightning.pytorch.strategies import DeepSpeedStrategy

    class RuleKeepingDeepSpeedStrategy(DeepSpeedStrategy):
        def __init__(self, grad_clip: float, max_nonfinite_in_row: int, **kwargs) -> None:
            super().__init__(**kwargs)
            self.config[DEEPSPEED_CLIP_KEY] = float(grad_clip)  # 0: no clipping, as phase.grad_clip=0
            self.max_nonfinite_in_row = max_nonfinite_in_row

        def _format_config(self) -> None:
            super()._format_config()
            bf16 = self.config.get(DEEPSPEED_BF16_KEY)
            if bf16 and bf16.get("enabled"):
                bf16[DEEPSPEED_OVERFLOW_KEY] = True

        def init_deepspeed(self) -> None:
            with warnings.catch_warnings():
                # Lightning warns that an overridden configure_gradient_clipping does not clip: true, and
                # by design here (the engine clips to the value set above).
                warnings.filterwarnings("ignore", message=LIGHTNING_CLIP_WARNING)
                super().init_deepspeed()
            engine = self.deepspeed_engine
            if self.lightning_module.trainer.training:
                log.info("DeepSpeed clips the gradients' global norm to %s (phase.grad_clip; 0 = off)%s",
                         engine.gradient_clipping(), "" if engine.fp16_enabled() else
                         f" and skips steps with non-finite gradients, {self.max_nonfinite_in_row} in a row at most")

        def optimizer_step(self, optimizer, closure, model=None, **kwargs):
            engine = self.deepspeed_engine
            steps, skipped = engine.global_steps, engine.skipped_steps
            result = super().optimizer_step(optimizer, closure, model, **kwargs)
            if engine.global_steps > steps and not engine.fp16_enabled():  # an accumulation boundary
                count_step(self.lightning_module, engine.skipped_steps == skipped, engine.get_global_grad_norm(),
                           self.max_nonfinite_in_row)
            return result

    return RuleKeepingDeepSpeedStrategy


def trained_state_fsdp():
    """Lightning's FSDPStrategy whose full state dict holds only what the phase's saves keep.

    Lightning's unshards the whole model into rank 0's host memory, which the phases'
    ``on_save_checkpoint`` then mostly drops (frozen weights are rebuilt from the config); this one
    gathers unit by unit and copies only the kept tensors (``fsdp_gather``). The state also serves
    the export (``callbacks.ExportCallback``). Loading is Lightning's: a full state dict without the
    frozen keys, as before."""
    from lightning.pytorch.strategies import FSDPStrategy

    class TrainedStateFSDPStrategy(FSDPStrategy):
        def lightning_module_state_dict(self) -> dict:
            if self._state_dict_type != "full":
                return super().lightning_module_state_dict()
            return fsdp_gather.gathered_state(self.model, self.global_rank, fsdp_gather.saved_by(self.lightning_module))

    return TrainedStateFSDPStrategy


def module_init(cfg: RunConfig, trainer) -> Callable[[], ContextManager]:
    """The context the phase's networks are built in (``phases.run.build_phase``'s ``init``).

    Lightning builds on the GPU under every strategy but FSDP, which builds on the CPU so that a model
    larger than one GPU can still be sharded; building a random or loaded 7B float32 model on the CPU
    then delays the first step by more than a minute (benchmarks/README.md, 'Numbers behind comments').
    ``trainer.fsdp_init_device=gpu`` builds each rank's whole model on its GPU first, as the other
    strategies do, for models whose weights fit one GPU in the precision's dtype (float32 under
    bf16-mixed).
    """
    if cfg.trainer.accelerator == "cpu":
        return contextlib.nullcontext
    if cfg.trainer.strategy == FSDP and cfg.trainer.fsdp_init_device == FSDP_GPU_INIT:
        return lambda: _on_root_device(trainer)
    if DEEPSPEED_STRATEGIES.get(cfg.trainer.strategy, (0, False))[0] == ZERO3_STAGE:
        # Lightning refuses empty_init=False under ZeRO-3, and its zero.Init context would hand the
        # builders empty partitioned parameters that their load_state_dict cannot fill: build on the CPU
        # as FSDP does, and let DeepSpeed partition the finished model when it wraps it.
        return contextlib.nullcontext
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
    if cfg.trainer.strategy != FSDP or cfg.trainer.fsdp_compute != FSDP_BF16_COMPUTE:
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


def is_deepspeed_strategy(strategy) -> bool:
    """Lightning's DeepSpeed strategy, ours (``rule_keeping_deepspeed``) included."""
    from lightning.pytorch.strategies import DeepSpeedStrategy

    return isinstance(strategy, DeepSpeedStrategy)


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
    if is_deepspeed_strategy(strategy) and strategy.zero_stage_3:
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


def check_strategy(cfg: RunConfig, writes_lora_adapter: bool) -> list[str]:
    """``trainer.strategy``, its precision and FSDP settings, and the strategy against what the phase's
    export needs (``writes_lora_adapter``: the phase's export holds a peft LoRA adapter folder); before
    anything is built."""
    t = cfg.trainer
    problems = choice("trainer.precision", str(t.precision), KNOWN_PRECISIONS)
    strategy = str(t.strategy)
    if strategy not in STRATEGIES:
        problems.append(f"trainer.strategy={strategy!r} is not a known strategy; use one of {STRATEGIES}")
        return problems
    if is_deepspeed(strategy):
        if t.accelerator == "cpu":
            problems.append(f"trainer.strategy={strategy!r} needs trainer.accelerator=gpu: DeepSpeed has no CPU "
                            f"path here (use strategy=ddp or auto on CPU)")
        if str(t.precision) not in DEEPSPEED_PRECISIONS:
            problems.append(f"trainer.precision={t.precision!r} is not supported by trainer.strategy={strategy!r}; "
                            f"use one of {DEEPSPEED_PRECISIONS}")
    if strategy == FSDP:
        problems += choice("trainer.fsdp_sharding", str(t.fsdp_sharding), FSDP_SHARDINGS)
    problems += choice("trainer.fsdp_compute", str(t.fsdp_compute), FSDP_COMPUTE)
    problems += choice("trainer.fsdp_init_device", str(t.fsdp_init_device), FSDP_INIT_DEVICES)
    if t.fsdp_init_device == FSDP_GPU_INIT and strategy != FSDP:
        problems.append(f"trainer.fsdp_init_device=gpu applies to trainer.strategy=fsdp only (got {strategy!r}); "
                        f"the other strategies build on the GPU already")
    if t.fsdp_compute == FSDP_BF16_COMPUTE and strategy != FSDP:
        problems.append(f"trainer.fsdp_compute=bf16 applies to trainer.strategy=fsdp only (got {strategy!r}); "
                        f"DeepSpeed's bf16 mode is already bf16 compute with float32 master weights")
    elif t.fsdp_compute == FSDP_BF16_COMPUTE and str(t.precision) != BF16_MIXED:
        problems.append(f"trainer.fsdp_compute=bf16 is a bf16-mixed mode: set trainer.precision={BF16_MIXED} "
                        f"(got {t.precision!r})")
    if strategy == FSDP and t.accelerator == "cpu":
        problems.append("trainer.strategy='fsdp' needs trainer.accelerator=gpu (Lightning's FSDP has no CPU path; "
                        "use strategy=ddp on CPU)")
    # ZeRO-3 partitions every parameter; exports gather them (full_weights), but the peft adapter
    # folders of phases that write one are not verified against ZeRO-3's partitioned LoRA tensors.
    partitioned = is_deepspeed(strategy) and DEEPSPEED_STRATEGIES[strategy][0] == PARTITIONED_STAGE
    if partitioned and writes_lora_adapter:
        problems.append(f"trainer.strategy={strategy!r} partitions the LoRA weights, and phase {cfg.phase.name!r} "
                        f"writes a peft LoRA adapter folder from them: use deepspeed_stage_2 (or "
                        f"deepspeed_stage_2_offload), fsdp or ddp")
    return problems
