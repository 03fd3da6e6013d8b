"""Randomness keyed by (seed, position) instead of a generator's running state.

Training draws every step's randomness from these keys, so a resumed or re-sharded run redraws what
the uninterrupted single-process run drew; the game seeds each turn's sampler the same way, so a
replayed game renders the same clips; models build their random weights under a fixed seed.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager, nullcontext
from typing import Iterable, Iterator, Optional

import torch


# Set by :func:`draw_on_caller_device`: seeded builds draw where the caller builds (benchmarks).
_CALLER_DEVICE = threading.local()


@contextmanager
def draw_on_caller_device() -> Iterator[None]:
    """Inside, seeded builds draw their random weights on the caller's device, as fast as it allows,
    but not as every other process and device would: for benchmarks' random weights, which nothing
    rebuilds. A random Mistral-7B took over 220 s to draw on the CPU of an H200 host (16 cores), about
    3 s on the GPU."""
    previous = getattr(_CALLER_DEVICE, "on", False)
    _CALLER_DEVICE.on = True
    try:
        yield
    finally:
        _CALLER_DEVICE.on = previous


@contextmanager
def seeded(seed: Optional[int]) -> Iterator[None]:
    """Seed the CPU RNG for random initialisation without leaking into the caller's stream (None:
    the caller's stream as it is). Models hold only what trains in checkpoints and exports, so their
    frozen random weights must come out the same in every process and on every resume.

    What is built inside is built on the CPU, whatever device the caller builds on (Lightning's
    ``init_module`` builds on the GPU): CUDA's generator draws other numbers from the same seed, so a
    frozen random base drawn on the GPU in training would not be the one that evaluation, the game
    and the pipeline rebuild on the CPU from the export's seed. The caller moves the module. Builds on
    the meta device (sizes without weights) stay there: they draw nothing; so do builds inside
    :func:`draw_on_caller_device`."""
    if seed is None:
        yield
        return
    on_caller = getattr(_CALLER_DEVICE, "on", False) or torch.get_default_device().type == "meta"
    with torch.random.fork_rng(devices=[]), nullcontext() if on_caller else torch.device("cpu"):
        torch.manual_seed(seed)
        yield


def step_seed(seed: int, step: int, rank: int) -> int:
    """A seed that depends only on (seed, step, rank)."""
    return ((seed * 1_000_003 + step) * 1_009 + rank) % 2**63


def step_generator(seed: int, step: int, rank: int, device: torch.device | str = "cpu") -> torch.Generator:
    """A generator that depends only on (seed, step, rank).

    All randomness of a training step (timesteps, noise, CFG dropout) comes from it, so a resumed
    run redraws exactly what the uninterrupted run drew, with no RNG state in the checkpoint.
    """
    generator = torch.Generator(device=device)
    generator.manual_seed(step_seed(seed, step, rank))
    return generator


def sample_positions(micro_step: int, batch_size: int, rank: int, world_size: int) -> list[int]:
    """Global stream positions of this rank's samples in one micro-step.

    :class:`~animegamer.data.indexed.StepSampler` deals the stream round-robin (local position p of
    rank r is global position p x world + r), so the positions of all ranks together are exactly those
    of one process taking the whole global batch.
    """
    return [(micro_step * batch_size + i) * world_size + rank for i in range(batch_size)]


class SampleRandom:
    """All randomness of a training step, drawn per sample from a generator keyed by the sample's
    global stream position.

    A sample draws the same timestep, noise and dropout whichever rank, batch split or resumed run it
    falls in: a run on N processes reproduces the single-process run with the same global batch, and
    a resumed run redraws exactly what the uninterrupted run drew, with no RNG state in checkpoints.
    Every draw loops over the samples, so each sample's generator sees the same sequence of calls.
    """

    def __init__(self, seed: int, positions: Iterable[int], device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self.generators = [step_generator(seed, position, 0, self.device) for position in positions]

    def __len__(self) -> int:
        return len(self.generators)

    def rand(self) -> torch.Tensor:
        """(B,) uniform in [0, 1)."""
        return torch.cat([torch.rand(1, generator=g, device=self.device) for g in self.generators])

    def randint(self, high: int) -> torch.Tensor:
        """(B,) int64 uniform in [0, high)."""
        return torch.cat([torch.randint(0, high, (1,), generator=g, device=self.device) for g in self.generators])

    def randn(self, shape: tuple[int, ...]) -> torch.Tensor:
        """(B, *shape) float32 standard normal."""
        return torch.stack([torch.randn(shape, generator=g, device=self.device, dtype=torch.float32)
                            for g in self.generators])
