"""The motion sweep: does the motion scope control the speed of what the decoder renders?

Each held-out clip is decoded from its own representation and the same noise once at every level's flow
value (the clip manifest's ``motion_bins.level_flow``: the median flow of the level's clips, what the
game conditions on), nothing else changed. The speed of each result is measured as ACC-F measures it, by
the pipeline's flow estimator on the decoded frames (output px per frame,
:func:`animegamer.metrics.motion.measure_levels`), and on the latents themselves
(:func:`animegamer.metrics.latent_motion.clip_speed`, latent px per latent frame: no VAE decoder and no
flow estimator in the way). Per measure: Spearman's rank correlation between the requested and the
measured speed over every clip and level, and the share of clips whose measured speed rises with the
level. A decoder that ignores its motion scope renders one clip at every level: correlation 0, no clip
rising. Unlike ACC-F, neither depends on the bins' edges or on the game predicting the level.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping, Sequence, TypeVar

import numpy as np

from animegamer.config.schema import NUM_MOTION_LEVELS
from animegamer.evaluation.drawing import figure, markdown_row
from animegamer.metrics.common import available, unavailable

LEVELS = tuple(range(1, NUM_MOTION_LEVELS + 1))
PIXEL_FLOW = "pixel_flow"
LATENT_SHIFT = "latent_shift"
# Whether the fine detail moves with the content (animegamer.metrics.detail_persistence): near 0 for a pan,
# near 1 for a still clip or detail fixed to the screen. Beside the speeds, they tell a renderer whose
# latents move but whose detail stays put from one that does not move at all.
PIXEL_PERSISTENCE = "detail_persistence"
LATENT_PERSISTENCE = "latent_detail_persistence"
PERSISTENCE = (PIXEL_PERSISTENCE, LATENT_PERSISTENCE)
UNITS = {PIXEL_FLOW: "output px per frame (the pipeline's flow estimator on the decoded frames)",
         LATENT_SHIFT: "latent px per latent frame (the sideways shift of the latents)",
         PIXEL_PERSISTENCE: "correlation, first frame to last (of the frames' detail finer than a latent px)",
         LATENT_PERSISTENCE: "correlation, first frame to last (of the latents' detail finer than 1 latent px)"}
# Each measure's headline metrics (what the known-answer table shows as columns): correlation, rising share.
HEADLINE = {PIXEL_FLOW: ("sweep_rho", "sweep_rising"), LATENT_SHIFT: ("sweep_rho_latent", "sweep_rising_latent")}
# Each persistence measure's headline metrics: its mean over the clips at every level above the slowest (where the
# known-answer films pan), and the same mean over the swept clips' own that are above it (the value to reach).
PERSISTENCE_HEADLINE = {PIXEL_PERSISTENCE: ("sweep_persistence", "sweep_persistence_truth"),
                        LATENT_PERSISTENCE: ("sweep_persistence_latent", "sweep_persistence_latent_truth")}
SWEEP_KEY = "motion_sweep"  # the detail record, beside the headline metrics
REFERENCE = "truth"  # in a measure: the same measure on the swept clips' own frames or latents
PLOT_FILE = "motion_sweep.png"

Rendered = TypeVar("Rendered")


# --------------------------------------------------------------------------- statistics
def average_ranks(values: Sequence[float]) -> np.ndarray:
    """1-based ranks of ``values``, tied values sharing the mean of their ranks."""
    values = np.asarray(values, dtype=np.float64)
    order = np.argsort(values, kind="stable")
    ranks = np.empty(len(values), dtype=np.float64)
    ranks[order] = np.arange(1, len(values) + 1)
    _, first, counts = np.unique(values[order], return_index=True, return_counts=True)
    for start, count in zip(first, counts):
        if count > 1:
            ranks[order[start:start + count]] = ranks[order[start:start + count]].mean()
    return ranks


def rank_correlation(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Spearman's rank correlation of two equally long sequences (Pearson's over their average ranks), or
    None when either has a single value throughout (it has no order to follow)."""
    if len(x) != len(y):
        raise ValueError(f"{len(x)} requested but {len(y)} measured values")
    rx, ry = average_ranks(x), average_ranks(y)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    scale = float(np.sqrt((rx ** 2).sum() * (ry ** 2).sum()))
    return float((rx * ry).sum() / scale) if scale > 0 else None


def rises(speeds: Sequence[float]) -> bool:
    """Whether speeds measured at increasing levels never fall and end above where they start."""
    steps = np.diff(np.asarray(speeds, dtype=np.float64))
    return bool((steps >= 0).all() and steps.sum() > 0)


def summarise(requested: Sequence[float], measured: np.ndarray) -> dict[str, Any]:
    """One measure over the sweep: ``measured`` (clips, levels) against the ``requested`` flow per level."""
    pairs = np.broadcast_to(np.asarray(requested, dtype=np.float64), measured.shape)
    return {"values": measured.tolist(), "mean_per_level": measured.mean(axis=0).tolist(),
            "rank_correlation": rank_correlation(pairs.ravel(), measured.ravel()),
            "rising_share": float(np.mean([rises(row) for row in measured]))}


# --------------------------------------------------------------------------- the sweep
def sweep(render: Callable[[int, float], Rendered], clips: int, level_flow: Mapping[int, float],
          measures: Mapping[str, Callable[[list[Rendered]], list[float]]]) -> dict[str, Any]:
    """``render(clip, flow)`` for every clip at every level's flow value; each of ``measures`` turns one
    clip's renderings (one per level, in level order) into their speeds, or raises ValueError for
    renderings it cannot measure (that measure is then left out, with the reason). A clip's renderings are
    measured and dropped before the next clip is rendered."""
    requested = [float(level_flow[level]) for level in LEVELS]
    values: dict[str, list[list[float]]] = {name: [] for name in measures}
    reasons = {} if clips else {name: "no held-out clip to sweep" for name in measures}
    for clip in range(clips):
        rendered = [render(clip, flow) for flow in requested]
        for name, measure in measures.items():
            if name in reasons:
                continue
            try:
                values[name].append([float(v) for v in measure(rendered)])
            except ValueError as error:
                reasons[name] = str(error)
    found = {name: {"unit": UNITS.get(name, ""),
                    **({"reason": reasons[name]} if name in reasons else
                       summarise(requested, np.asarray(rows, dtype=np.float64).reshape(clips, len(LEVELS))))}
             for name, rows in values.items()}
    return {"levels": list(LEVELS), "requested": requested, "clips": clips, "measures": found}


def with_truth(result: dict[str, Any], name: str, levels: Sequence[int], values: Sequence[float]) -> None:
    """Add to ``result``'s measure ``name`` (if measured) the same measure on the swept clips' own frames or
    latents, with each clip's level: what a renderer that moves as the clip does would give at that level."""
    measure = result["measures"].get(name)
    if measure is not None and "reason" not in measure:
        measure[REFERENCE] = {"levels": [int(level) for level in levels], "values": [float(v) for v in values]}


def per_level_means(levels: Sequence[int], values: Sequence[float]) -> dict[int, float]:
    """The mean of ``values`` per level of ``levels`` (each value's), for the levels that have one, in order."""
    levels, values = np.asarray(levels), np.asarray(values, dtype=np.float64)
    return {int(level): float(values[levels == level].mean()) for level in sorted(set(levels.tolist()))}


def headline(result: Mapping[str, Any]) -> dict[str, dict]:
    """The headline metrics of a sweep (:data:`HEADLINE`, :data:`PERSISTENCE_HEADLINE`), each unavailable with its
    reason where there is no value (no clip, a measure that could not measure, measured speeds all equal, or no
    swept clip above the slowest level to give the truth's persistence)."""
    found = {}
    for name, (rho_key, rising_key) in HEADLINE.items():
        measure = result["measures"].get(name) or {"reason": f"{name} not measured"}
        if "reason" in measure:
            found.update({rho_key: unavailable(measure["reason"]), rising_key: unavailable(measure["reason"])})
            continue
        rho = measure["rank_correlation"]
        found[rho_key] = (available(rho) if rho is not None else
                          unavailable("every clip at every level measured the same speed: no order to correlate"))
        found[rising_key] = available(measure["rising_share"])
    for name, (key, truth_key) in PERSISTENCE_HEADLINE.items():
        measure = result["measures"].get(name) or {"reason": f"{name} not measured"}
        if "reason" in measure:
            found.update({key: unavailable(measure["reason"]), truth_key: unavailable(measure["reason"])})
            continue
        found[key] = available(float(np.asarray(measure["values"], dtype=np.float64)[:, 1:].mean()))
        truth = measure.get(REFERENCE) or {"levels": [], "values": []}
        above = [v for level, v in zip(truth["levels"], truth["values"]) if level > LEVELS[0]]
        found[truth_key] = (available(float(np.mean(above))) if above else
                            unavailable(f"no swept clip of its own above level {LEVELS[0]}"))
    return found


# --------------------------------------------------------------------------- report
def find(metrics: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The sweep of a report's metrics: its own (a reconstruction report) or its reconstruction's."""
    return metrics.get(SWEEP_KEY) or (metrics.get("reconstruction") or {}).get(SWEEP_KEY)


def plot(result: Mapping[str, Any], path: Path) -> bool:
    """Requested against measured speed, one panel per measure: each clip's line and the mean per level."""
    measures = [(name, m) for name, m in result["measures"].items() if m.get("values")]
    if not measures:
        return False
    fig = figure(4.5 * len(measures), 4.0)
    requested = np.asarray(result["requested"], dtype=np.float64)
    for index, (name, measure) in enumerate(measures):
        ax = fig.add_subplot(1, len(measures), index + 1)
        for row in measure["values"]:
            ax.plot(requested, row, color="tab:blue", alpha=0.25, linewidth=0.8)
        ax.plot(requested, measure["mean_per_level"], color="tab:blue", marker="o", linewidth=2,
                label="mean over clips")
        if name == PIXEL_FLOW:  # the same unit on both axes: where a clip moving as asked would lie
            ax.plot(requested, requested, color="gray", linestyle="--", linewidth=1, label="as requested")
        if measure.get(REFERENCE):  # the true clips, each at its own level's flow
            truth = measure[REFERENCE]
            ax.scatter([requested[level - 1] for level in truth["levels"]], truth["values"], color="gray",
                       marker="x", label="true clips")
        rho = measure["rank_correlation"]
        ax.set_title(f"{name.replace('_', ' ')}: rho {'n/a' if rho is None else f'{rho:.2f}'}, "
                     f"rising {measure['rising_share']:.2f}", fontsize="medium")
        ax.set_xlabel("requested flow (level's median, px/frame)")
        ax.set_ylabel(UNITS.get(name, name).split(" (")[0])
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path)
    return True


def markdown(result: Mapping[str, Any], plot_name: str | None) -> list[str]:
    """report.md's section: the sweep's table (and its plot, when drawn)."""
    flows = " / ".join(f"{v:.2f}" for v in result["requested"])
    lines = ["## Motion sweep", "",
             f"{result['clips']} held-out clips, each decoded from its own representation and the same noise at every "
             f"level's flow value (levels {LEVELS[0]}-{LEVELS[-1]}: {flows} px/frame), nothing else changed. Spearman "
             "rho: requested against measured speed over every clip and level (1: the speed follows the motion scope; "
             "0: it ignores it). Rising: the share of clips whose measured speed never falls and ends higher. The "
             "detail persistence falls as a clip moves faster, so there a renderer that follows the motion scope "
             "gives a negative rho and no clip rising.", "",
             "| measure | unit | Spearman rho | rising | mean measured per level |", "|---|---|---|---|---|"]
    for name, measure in result["measures"].items():
        if "reason" in measure:
            lines.append(markdown_row(name.replace("_", " "), measure["unit"], f"n/a ({measure['reason']})", "-", "-"))
            continue
        rho = measure["rank_correlation"]
        lines.append(markdown_row(name.replace("_", " "), measure["unit"], "n/a" if rho is None else f"{rho:.3f}",
                                  f"{measure['rising_share']:.3f}",
                                  " / ".join(f"{v:.2f}" for v in measure["mean_per_level"])))
    lines.append("")
    truths = [(name, m[REFERENCE]) for name, m in result["measures"].items() if m.get(REFERENCE)]
    if truths:
        lines += ["The true clips, each at its own level (mean per level, levels without a clip left out): " + "; ".join(
            f"{name.replace('_', ' ')} " + " / ".join(f"{level}: {value:.2f}" for level, value in
                                                     per_level_means(truth["levels"], truth["values"]).items())
            for name, truth in truths), ""]
    if plot_name:
        lines += [f"![motion sweep]({plot_name})", ""]
    return lines
