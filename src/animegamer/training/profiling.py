"""``trainer.profiler``: where a training step's time goes, through Lightning's profilers.

``simple`` / ``advanced`` time Lightning's hooks (advanced: cProfile per hook); ``pytorch`` records
kernels and operators of optimizer steps ``skip + 2 .. skip + 1 + active`` (``trainer.profile_skip_steps``,
``trainer.profile_active_steps``; step ``skip + 1`` warms the profiler up), writes a Chrome trace of
the window (open in Perfetto or chrome://tracing) and a table of the most expensive operators, all
under ``<output_dir>/profile``.
"""
from __future__ import annotations

import logging
from pathlib import Path

from animegamer.config.schema import RunConfig
from animegamer.config.validate import choice
from animegamer.training.trace_summary import write_summaries

# Lightning's profilers and torch are imported inside the functions that make a profiler: the config
# check imports this module for its choices and runs before anything heavy is loaded.
PYTORCH = "pytorch"
PROFILERS = ("", "simple", "advanced", PYTORCH)
PROFILE_DIR = "profile"
TRACE_NAME = "ops"  # the pytorch profiler's file name part: fit-ops.txt, fit-ops-<action>...pt.trace.json

log = logging.getLogger(__name__)


def profiled_steps(skip: int, active: int) -> range:
    """The optimizer steps (1-based) that ``trainer.profiler=pytorch`` records."""
    return range(skip + 2, skip + 2 + active)


def check_profiler(cfg: RunConfig) -> list[str]:
    """``trainer.profiler`` and, for the pytorch profiler, a recorded window inside ``phase.max_steps``."""
    t = cfg.trainer
    problems = choice("trainer.profiler", str(t.profiler), PROFILERS)
    if t.profiler != PYTORCH:
        return problems
    if t.profile_skip_steps < 0 or t.profile_active_steps < 1:
        problems.append(f"trainer.profile_skip_steps={t.profile_skip_steps} must be >= 0 and "
                        f"trainer.profile_active_steps={t.profile_active_steps} >= 1")
    elif profiled_steps(t.profile_skip_steps, t.profile_active_steps)[-1] > cfg.phase.max_steps:
        window = profiled_steps(t.profile_skip_steps, t.profile_active_steps)
        problems.append(f"trainer.profiler=pytorch records steps {window[0]}..{window[-1]}, past "
                        f"phase.max_steps={cfg.phase.max_steps}: no trace would be written (lower "
                        f"trainer.profile_skip_steps)")
    return problems


def make_profiler(cfg: RunConfig):
    """The Lightning profiler of ``cfg.trainer.profiler`` (None when off)."""
    t = cfg.trainer
    if not t.profiler:
        return None
    dirpath = str(Path(cfg.output_dir) / PROFILE_DIR)
    if t.profiler == "simple":
        from lightning.pytorch.profilers import SimpleProfiler

        return SimpleProfiler(dirpath=dirpath, filename="hooks")
    if t.profiler == "advanced":
        from lightning.pytorch.profilers import AdvancedProfiler

        return AdvancedProfiler(dirpath=dirpath, filename="hooks")
    import torch

    on_gpu = t.accelerator != "cpu"
    # Lightning steps the schedule once per micro-batch: skip the warm-up steps (compilation, allocator
    # growth, first all-gathers), trace one more step without recording (the profiler's own start-up),
    # then record whole optimizer steps.
    accumulate = t.accumulate_grad_batches
    schedule = torch.profiler.schedule(skip_first=t.profile_skip_steps * accumulate, wait=0, warmup=accumulate,
                                       active=t.profile_active_steps * accumulate, repeat=1)
    # No per-module ranges: Lightning's default adds a record_function hook to every module, which adds
    # host work to each of phase (b)'s ~2,000 module calls per step (the cost one profiles for when the
    # step is host-bound), and hooks added to compiled layers when the window opens recompile them
    # inside the recorded steps (measured: benchmarks/README.md, 'Numbers behind comments').
    return _windowed_profiler()(dirpath=dirpath, filename=TRACE_NAME, export_to_chrome=True, schedule=schedule,
                                sort_by_key="cuda_time_total" if on_gpu else "cpu_time_total", row_limit=40,
                                record_module_names=False)


def _windowed_profiler():
    from lightning.pytorch.profilers import PyTorchProfiler

    class WindowedPyTorchProfiler(PyTorchProfiler):
        """Lightning's PyTorchProfiler with a schedule that ends (repeat=1): once the window closed,
        torch's profiler holds no events, and Lightning's teardown asked for them anyway
        ("Profiler must be initialized before accessing events"); the table was written already."""

        def _cache_functions_events(self) -> None:
            try:
                super()._cache_functions_events()
            except AssertionError:
                self.function_events = None

    return WindowedPyTorchProfiler


def summarise_traces(cfg: RunConfig, trainer, since: float) -> None:
    """After a ``pytorch``-profiled fit: write and log the step breakdown of rank 0's traces written since
    ``since`` (a resumed run leaves the earlier run's traces alone). A trace that cannot be read is
    reported, never raised: the run's results matter more than its profile."""
    if cfg.trainer.profiler != PYTORCH or not trainer.is_global_zero:
        return
    folder = Path(cfg.output_dir) / PROFILE_DIR
    # Lightning's trace names: <stage>-<filename>[-<local rank> when several processes]-<action>...
    prefix = "-".join(["fit", TRACE_NAME, *(["0"] if trainer.world_size > 1 else []), ""])
    try:
        for path in write_summaries(folder, since=since, rank=0, prefix=prefix):
            log.info("profiled steps (%s):\n%s", path, path.read_text())
    except (OSError, ValueError, KeyError) as error:
        log.warning("could not summarise the profiler traces in %s: %s", folder, error)
