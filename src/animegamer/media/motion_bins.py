"""Motion levels 1..5: the quantisation of a clip's mean flow (:mod:`animegamer.media.flow`) by the edges
the clip shards' manifest records, and the flow each level stands for at inference."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from animegamer.config.schema import NUM_MOTION_LEVELS, MotionConfig

LEVELS = tuple(range(1, NUM_MOTION_LEVELS + 1))
QUANTILES = tuple(i / NUM_MOTION_LEVELS for i in range(1, NUM_MOTION_LEVELS))


@dataclass(frozen=True)
class MotionBins:
    """Inner edges between consecutive levels and the flow value that stands for each level."""

    edges: tuple[float, ...]  # NUM_MOTION_LEVELS - 1 values, non-decreasing
    level_flow: dict[int, float]  # level -> representative flow (median flow of its clips)
    source: str  # "quantile" | "fixed"
    counts: dict[int, int]

    def level(self, flow: float) -> int:
        # Strictly-below counting: with many still clips several quantile edges can be 0.0, and a
        # flow of exactly 0.0 must still be level 1.
        return int(np.searchsorted(np.asarray(self.edges), flow, side="left")) + 1

    def to_json(self) -> dict:
        return {
            "edges": list(self.edges),
            "level_flow": {str(k): v for k, v in self.level_flow.items()},
            "counts": {str(k): v for k, v in self.counts.items()},
            "source": self.source,
        }

    @classmethod
    def from_json(cls, data: dict) -> "MotionBins":
        return cls(
            tuple(data["edges"]),
            {int(k): float(v) for k, v in data["level_flow"].items()},
            data["source"],
            {int(k): int(v) for k, v in data["counts"].items()},
        )


def compute_bins(flows: list[float], cfg: MotionConfig) -> MotionBins:
    """Edges from config or from the data's quantiles; representative flow = median of each level.

    A level with no clips gets the centre of its bin (the last level: its lower edge), so inference
    still has a value to condition on; ``counts`` records that it was empty.
    """
    values = np.asarray(flows, dtype=np.float64)
    if cfg.bins == "fixed" or values.size == 0:
        edges = tuple(float(e) for e in cfg.fixed_edges)
        source = "fixed"
    else:
        edges = tuple(float(e) for e in np.quantile(values, QUANTILES))
        source = "quantile"
    provisional = MotionBins(edges, {}, source, {})
    levels = np.array([provisional.level(v) for v in values], dtype=np.int64)
    level_flow, counts = {}, {}
    for level in LEVELS:
        members = values[levels == level]
        counts[level] = int(members.size)
        if members.size:
            level_flow[level] = float(np.median(members))
        else:
            low = edges[level - 2] if level > 1 else 0.0
            high = edges[level - 1] if level <= len(edges) else low
            level_flow[level] = (low + high) / 2
    return MotionBins(edges, level_flow, source, counts)
