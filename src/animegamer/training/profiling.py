"""``trainer.profiler``: where a training step's time goes, through Lightning's profilers.

``simple`` / ``advanced`` time Lightning's hooks (advanced: cProfile per hook); ``pytorch`` records
``trainer.profile_active_steps`` optimizer steps of kernels and operators after
``trainer.profile_skip_steps`` warm-up steps, writes a Chrome trace per recorded window (open in
Perfetto or chrome://tracing) and a table of the most expensive operators, all under
``<output_dir>/profile``.
"""
from __future__ import annotations

from pathlib import Path

from animegamer.config.schema import RunConfig

PROFILERS = ("", "simple", "advanced", "pytorch")
PROFILE_DIR = "profile"


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
    # Lightning steps the schedule once per training batch: skip the warm-up (compilation, allocator
    # growth, first all-gathers), then record a few steps.
    schedule = torch.profiler.schedule(skip_first=t.profile_skip_steps * t.accumulate_grad_batches, wait=0,
                                       warmup=1, active=t.profile_active_steps * t.accumulate_grad_batches,
                                       repeat=1)
    return _windowed_profiler()(dirpath=dirpath, filename="ops", export_to_chrome=True, schedule=schedule,
                                sort_by_key="cuda_time_total" if on_gpu else "cpu_time_total", row_limit=40)


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
