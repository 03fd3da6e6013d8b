"""What the known-answer benchmark writes besides its JSON: the rows of its table (each evaluation's game,
baselines and reconstruction), the trained game against every other row with the sampling noise of each
margin, the table itself, the training curves of its stages and the gallery of generated clips under
their ground truth (:mod:`benchmarks.known_answer.driver` runs the benchmark)."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
from PIL import Image

from animegamer.contracts.states import MOTION_LEVEL
from animegamer.evaluation.drawing import figure
from animegamer.evaluation.motion_sweep import PERSISTENCE_HEADLINE
from animegamer.media.video import decode_mp4
from animegamer.phases.specs import A_BASE, A_JOINT, A_WARMUP, PHASE_B, PHASE_C
from animegamer.recipe import step_losses
from animegamer.training.faults import LOSS_HISTORY
from benchmarks.known_answer.data import CAPTION_WORDS_MEANING, LEVEL_WORDS, TRUTH_WORDS_KEY

TRAINED = "trained game"
RECONSTRUCTION = "a2 reconstruction (own representation)"
# The sweep's detail persistence beside the swept clips' own (the truth's): not a score of the row but what the
# metric beside it should reach, so no row is compared on it.
REFERENCE_METRICS = frozenset(truth for _, truth in PERSISTENCE_HEADLINE.values())
# Metrics where lower is better; every other metric is better higher. The renderings' detail persistence is
# better lower down to its truth's (below that is flicker, which the pixel flow then shows as speed).
LOWER_IS_BETTER = frozenset({"mae_s", "mae_f", "dreamsim", *(key for key, _ in PERSISTENCE_HEADLINE.values())})
# Each is the share of items (game turns, reconstructed clips) whose speed level came out right (acc_f: the
# true level; acc_f_requested: the level the game asked its renderer for): a binomial proportion over few
# items, so two rows are told apart only against its sampling noise.
PER_ITEM_SHARES = frozenset({"acc_f", "acc_f_requested"})
CURVE_SMOOTHING = 10  # steps in the moving average drawn over each stage's per-step loss
GALLERY_TURNS = 3
GALLERY_FRAMES = 5  # frames per clip in the gallery strip, evenly spaced
STAGES = (A_BASE, A_WARMUP, A_JOINT, PHASE_B, PHASE_C)  # the run folders whose loss histories are plotted


# --------------------------------------------------------------------------- the table
def metric_values(metrics: dict) -> dict[str, float | None]:
    """Every scalar metric of one evaluation row: ``{"available": ..., "value": ...}`` entries (an
    unavailable one as None)."""
    values = {}
    for key, metric in metrics.items():
        if isinstance(metric, dict) and "available" in metric and key != "seconds_per_turn":
            values[key] = float(metric["value"]) if metric["available"] and metric.get("value") is not None else None
    return values


def item_hits(metrics: dict) -> dict[str, dict[str, list[int]]]:
    """Per share metric, each item's outcome (1: its speed level came out right) beside the targets that
    identify the items, so two rows over the same items can be compared item by item."""
    motion = metrics.get("motion")
    if not isinstance(motion, dict) or "levels" not in motion or "targets" not in motion:
        return {}
    hits = {"acc_f": {"targets": list(motion["targets"]),
                      "hits": [int(level == target) for level, target in zip(motion["levels"], motion["targets"])]}}
    if "requested" in motion:  # a game's: the items are the same turns only where the requests are the same
        hits["acc_f_requested"] = {"targets": list(motion["requested"]), "hits": [
            int(level == asked) for level, asked in zip(motion["levels"], motion["requested"])]}
    return hits


def row(label: str, metrics: dict, baseline: str | None = None) -> dict:
    found = {"row": label, **({"baseline": baseline} if baseline else {}), "metrics": metric_values(metrics)}
    hits = item_hits(metrics)
    return {**found, "items": hits} if hits else found


def rows_of(name: str, metrics: dict) -> list[dict]:
    """The rows one evaluation gives: its game (labelled ``name``), each of its baselines, and its
    reconstruction with the reconstruction's baselines."""
    rows = [row(name, metrics)]
    for key, baseline in (metrics.get("baselines") or {}).items():
        rows.append(row(baseline.get("label", key), baseline, key))
    reconstruction = metrics.get("reconstruction")
    if reconstruction:
        label = RECONSTRUCTION if name == TRAINED else f"{name}: {RECONSTRUCTION}"
        rows.append(row(label, reconstruction))
        for key, baseline in (reconstruction.get("baselines") or {}).items():
            rows.append(row(f"{label}, {baseline.get('label', key)}", baseline, key))
    return rows


def share_noise(p: float, q: float, n_p: int, n_q: int) -> float:
    """The standard error of the difference of two shares over ``n_p`` and ``n_q`` items, taken as
    independent samples: the bound when the rows' outcomes item by item are not at hand (rows over the
    same items are correlated, either way: :func:`paired_noise` measures them)."""
    return math.sqrt(p * (1 - p) / n_p + q * (1 - q) / n_q)


def paired_noise(mine: dict, other: dict) -> float | None:
    """The standard error of the mean of per-item differences between two rows scored on the same items
    (the same targets in the same order), or None when they were not: how much the margin would move over
    other items drawn alike. Items where both rows agree add nothing to it."""
    if not mine or not other or mine["targets"] != other["targets"] or len(mine["hits"]) < 2:
        return None
    diffs = [a - b for a, b in zip(mine["hits"], other["hits"])]
    mean = sum(diffs) / len(diffs)
    return math.sqrt(sum((d - mean) ** 2 for d in diffs) / (len(diffs) - 1) / len(diffs))


def comparisons(rows: list[dict], items: dict[str, int] | None = None) -> dict[str, dict[str, dict[str, float]]]:
    """Per metric of the trained game (and of its reconstruction), every other row's value and how much
    better the trained one is (positive: trained better; lower-is-better metrics are negated). With
    ``items`` (``{TRAINED: game turns, RECONSTRUCTION: clips}``) a share's comparison also carries
    ``noise``, the standard error of the margin: item by item where both rows have their items' outcomes
    (:func:`paired_noise`, ``noise_kind`` "paired"), else the independent bound (:func:`share_noise`)."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for reference in (TRAINED, RECONSTRUCTION):
        mine_row = next((r for r in rows if r["row"] == reference), {"metrics": {}})
        count = (items or {}).get(reference)
        for key, value in mine_row["metrics"].items():
            if value is None or key in REFERENCE_METRICS:
                continue
            sign = -1.0 if key in LOWER_IS_BETTER else 1.0
            out.setdefault(f"{reference}: {key}", {})
            for other_row in rows:
                other = other_row["metrics"].get(key)
                # A game's clips are compared with games', a reconstruction's with reconstructions'.
                same_kind = (RECONSTRUCTION in other_row["row"]) == (reference == RECONSTRUCTION)
                if other_row["row"] == reference or other is None or not same_kind:
                    continue
                entry = {"value": other, "trained": value, "margin": sign * (value - other)}
                if key in PER_ITEM_SHARES and count:
                    paired = paired_noise(mine_row.get("items", {}).get(key), other_row.get("items", {}).get(key))
                    entry.update({"noise": paired, "noise_kind": "paired"} if paired is not None else
                                 {"noise": share_noise(value, other, count, count), "noise_kind": "independent"})
                out[f"{reference}: {key}"][other_row["row"]] = entry
    return out


def level_rule_lines(about: dict, keys: list[str]) -> list[str]:
    """What bounds a game's acc_f when its instruction does not tell the motion level: the game model predicts
    the level its renderer is asked for from the instruction (and its own earlier turns), so a game can ask for
    the true level about as often as the instruction's words tell it, whatever the renderer draws."""
    rule = (((about.get("data") or {}).get("rules") or {}).get(MOTION_LEVEL)) or {}
    if "acc_f" not in keys or rule.get("consistency") is None or rule["consistency"] >= 1:
        return []
    return [f"The instruction's motion words tell a training clip's motion level in {rule['consistency']:.2f} "
            "of the clips (`data.rules.ML`: the share the most common level of each word pair gets right). A game "
            "renders the level its model predicts from those words, so its acc_f stays near that share however "
            "well the renderer follows the motion scope; acc_f_requested scores the game's clips against the "
            "level they were asked for, the renderer's part alone."]


def write_table(path: Path, rows: list[dict], about: dict) -> None:
    keys = sorted({k for r in rows for k, v in r["metrics"].items() if v is not None})
    fmt = lambda v: "" if v is None else f"{v:.3f}"
    words = about.get(TRUTH_WORDS_KEY, LEVEL_WORDS)  # results from before the choice: level words
    lines = [f"Known-answer benchmark, size {about['size']}, seed {about['seed']}, captions with {words} words "
             f"({CAPTION_WORDS_MEANING[words]}): held-out shots ({about.get('turns', '?')} game turns, "
             f"{about.get('reconstruction_clips', '?')} reconstructed clips).", "",
             "| row | " + " | ".join(keys) + " |", "|---|" + "---:|" * len(keys)]
    lines += [f"| {r['row']} | " + " | ".join(fmt(r["metrics"].get(k)) for k in keys) + " |" for r in rows]
    references = sorted(REFERENCE_METRICS & set(keys))
    lines += ["", "Lower is better for " + ", ".join(sorted(LOWER_IS_BETTER & set(keys))) + "; higher for the rest"
              + (f" but {', '.join(references)}: the swept clips' own value, which the column named without _truth "
                 "should reach"
                 if references else "") + ". An empty cell: the metric does not apply to the row (or had no weights)."]
    lines += level_rule_lines(about, keys)
    counts = [(n, what) for n, what in ((about.get("turns"), "game turns"),
                                        (about.get("reconstruction_clips"), "reconstructed clips")) if n]
    if PER_ITEM_SHARES & set(keys) and counts:
        noise = "; ".join(f"{share_noise(0.5, 0.5, n, n):.2f} between two rows over {n} {what}" for n, what in counts)
        lines += [f"Sampling noise of {', '.join(sorted(PER_ITEM_SHARES & set(keys)))} (a share of few items; "
                  f"the standard error of a difference, at its widest): {noise}. A gap under about twice that "
                  "does not tell two rows apart. `noise` in known_answer.json is each comparison's own, item by "
                  "item where both rows scored the same items (`noise_kind` paired); neither counts the "
                  "randomness of training again, which other seeds measure."]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


# --------------------------------------------------------------------------- curves and gallery
def loss_histories(runs: Path) -> dict[str, list[tuple[int, float]]]:
    """Each stage's per-step training loss (micro-batches of a step averaged), from its run folder."""
    return {stage: step_losses(runs / stage) for stage in STAGES if (runs / stage / LOSS_HISTORY).exists()}


def plot_curves(histories: dict[str, list[tuple[int, float]]], path: Path) -> bool:
    """One panel per stage (their losses differ in kind and scale): per-step loss and its moving average."""
    if not histories:
        return False
    fig = figure(3.2 * len(histories), 3.0)
    for index, (stage, points) in enumerate(histories.items()):
        ax = fig.add_subplot(1, len(histories), index + 1)
        steps, losses = (np.asarray(v, dtype=float) for v in zip(*points))
        ax.plot(steps, losses, alpha=0.3, linewidth=0.8)
        window = min(CURVE_SMOOTHING, len(losses))
        smooth = np.convolve(losses, np.ones(window) / window, mode="valid")
        ax.plot(steps[window - 1:], smooth, linewidth=1.5)
        ax.set_title(stage)
        ax.set_xlabel("step")
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
    fig.axes[0].set_ylabel("training loss")
    fig.tight_layout()
    fig.savefig(path)
    return True


def write_gallery(eval_out: Path, path: Path) -> bool:
    """The first turns' generated clips (even rows) under their ground truth (odd rows), a few frames each."""
    metrics = json.loads((eval_out / "metrics.json").read_text())
    turns = [t for g in metrics.get("games", []) for t in g.get("turns", []) if t.get("truth_video")][:GALLERY_TURNS]
    strips = []
    for turn in turns:
        for video in (turn["truth_video"], turn["video"]):
            frames = decode_mp4((eval_out / video).read_bytes())  # metrics.json: relative to its folder
            picks = np.linspace(0, len(frames) - 1, GALLERY_FRAMES).round().astype(int)
            strips.append(np.concatenate([frames[i] for i in picks], axis=1))
    if not strips:
        return False
    Image.fromarray(np.concatenate(strips, axis=0)).save(path)
    return True
