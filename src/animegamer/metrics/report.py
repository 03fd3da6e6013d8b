"""Evaluation report: ``metrics.json``, ``report.md`` (ours beside the paper's numbers), PNG plots and
``gallery.html`` (every game as a row of its turns' clips, instructions and states).

``metrics`` holds the headline metrics under the keys of ``METRIC_INFO`` (plain numbers or
``available``/``unavailable`` dicts) and optionally the detail dicts ``"motion"`` (from
``motion_accuracy``) and ``"states"`` (from ``state_accuracy``); a headline ACC-F/MAE-F/ACC-S/MAE-S
missing at the top level is read from those. ``games`` is a list of
``{"id": str (optional), "turns": [{"instruction", "video" (mp4 path), "states" (predicted),
"target_states" (optional), "environment" (optional), "metrics" {per-turn metrics}}]}``; the per-turn
keys the plots read are ``clip_i``, ``dreamsim``, ``clip_t``, ``clip_t_env`` and, when there is no
``metrics["motion"]``, ``motion_level`` / ``target_level``.
"""
from __future__ import annotations

import html
import json
import logging
import math
import os
from pathlib import Path
from typing import Any, Mapping, Sequence
from urllib.parse import quote

import numpy as np

from animegamer.config.schema import NUM_MOTION_LEVELS
from animegamer.metrics.common import as_metric, format_metric, is_metric, metric_value

logger = logging.getLogger(__name__)

# The paper's Table 1 row for AnimeGamer (DESIGN section 8). DreamSim is a similarity (higher is better).
PAPER_TABLE1 = {
    "clip_i": 0.8132,
    "dreamsim": 0.7403,
    "clip_t": 0.4161,
    "clip_t_env": 0.4012,
    "acc_f": 0.6744,
    "mae_f": 0.4238,
    "acc_s": 0.6773,
    "mae_s": 0.5872,
    "seconds_per_turn": 24.0,
}
# The paper's Table 3: reconstruction of ground-truth clips through the phase (a) encoder/decoder.
PAPER_TABLE3_RECONSTRUCTION = {"clip_i": 0.8672, "dreamsim": 0.7928}

# key -> (label, higher is better, decimals), in report order.
METRIC_INFO = {
    "clip_i": ("CLIP-I", True, 4),
    "dreamsim": ("DreamSim", True, 4),
    "clip_t": ("CLIP-T", True, 4),
    "clip_t_env": ("CLIP-T^E", True, 4),
    "acc_f": ("ACC-F", True, 4),
    "mae_f": ("MAE-F", False, 4),
    "acc_s": ("ACC-S", True, 4),
    "mae_s": ("MAE-S", False, 4),
    "seconds_per_turn": ("Time (s/turn)", False, 2),
}
CONSISTENCY_KEYS = ("clip_i", "dreamsim", "clip_t", "clip_t_env")
_DETAIL_SOURCES = {"acc_f": "motion", "mae_f": "motion", "acc_s": "states", "mae_s": "states"}

_NOTES = (
    (("clip_i", "dreamsim"), "CLIP-I / DreamSim: generated frames vs the character's reference image "
     "(mean over frame pairs); DreamSim is reported as similarity = 1 - DreamSim distance."),
    (("clip_t", "clip_t_env"), "CLIP-T: frames vs the instruction, CLIP-T^E: frames vs the environment "
     "text (raw cosines)."),
    (("acc_f", "mae_f"), "ACC-F / MAE-F: motion level of each generated clip, measured with the data "
     "pipeline's flow estimator and bins, against the target level."),
    (("acc_s", "mae_s"), "ACC-S / MAE-S: predicted state values (ML, SC, ET, ST) against the targets."),
)

PLOT_FILES = {
    "consistency_plot": "per_turn_consistency.png",
    "motion_plot": "motion_confusion.png",
    "states_plot": "state_accuracy.png",
}


# --------------------------------------------------------------------------- metrics
def headline(metrics: Mapping[str, Any]) -> dict[str, dict]:
    """Every headline metric present, as a metric dict (detail dicts fill ACC/MAE gaps)."""
    out = {}
    for key in METRIC_INFO:
        value = metrics.get(key)
        if value is None and key in _DETAIL_SOURCES:
            value = (metrics.get(_DETAIL_SOURCES[key]) or {}).get(key)
        if value is not None:
            out[key] = as_metric(value)
    return out


def _label(key: str) -> str:
    return METRIC_INFO[key][0] if key in METRIC_INFO else key


def _fmt(key: str, value: Any) -> str:
    return format_metric(value, METRIC_INFO[key][2] if key in METRIC_INFO else 4)


def _jsonable(obj: Any) -> Any:
    """Plain JSON types; numpy scalars/arrays and paths converted, non-finite floats -> null."""
    if isinstance(obj, Mapping):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return _jsonable(obj.tolist())
    if isinstance(obj, np.generic):
        return _jsonable(obj.item())
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, float) and not math.isfinite(obj):
        logger.warning("non-finite value %r written as null in metrics.json", obj)
        return None
    if obj is None or isinstance(obj, (str, int, float, bool)):
        return obj
    raise TypeError(f"cannot write {type(obj).__name__} to metrics.json: {obj!r}")


# --------------------------------------------------------------------------- plots
def _figure(width: float = 6.0, height: float = 4.0):
    """A pyplot-free Agg figure: no global backend switch, no figure registry to leak."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    return fig


def _per_turn_means(games: Sequence[Mapping]) -> dict[str, list[tuple[int, float]]]:
    """key -> [(turn number, mean over games of the available per-turn values)]."""
    series: dict[str, dict[int, list[float]]] = {k: {} for k in CONSISTENCY_KEYS}
    for game in games:
        for t, turn in enumerate(game.get("turns", []), start=1):
            for key in CONSISTENCY_KEYS:
                value = metric_value((turn.get("metrics") or {}).get(key))
                if value is not None:
                    series[key].setdefault(t, []).append(value)
    return {k: sorted((t, float(np.mean(v))) for t, v in s.items()) for k, s in series.items() if s}


def plot_consistency(games: Sequence[Mapping], path: Path) -> bool:
    series = _per_turn_means(games)
    if not series:
        return False
    fig = _figure()
    ax = fig.add_subplot()
    for key, points in series.items():
        turns, values = zip(*points)
        ax.plot(turns, values, marker="o", label=_label(key))
    ax.set_xlabel("turn")
    ax.set_ylabel("similarity (mean over games)")
    ax.set_title("Consistency per turn")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    return True


def _confusion(metrics: Mapping, games: Sequence[Mapping]) -> np.ndarray | None:
    """[target - 1][measured - 1] counts from metrics["motion"], else from per-turn levels."""
    motion = metrics.get("motion") or {}
    if motion.get("confusion") is not None:
        return np.asarray(motion["confusion"], dtype=np.int64)
    pairs = list(zip(motion.get("levels") or [], motion.get("targets") or []))
    if not pairs:
        for game in games:
            for turn in game.get("turns", []):
                m = turn.get("metrics") or {}
                if m.get("motion_level") is not None and m.get("target_level") is not None:
                    pairs.append((m["motion_level"], m["target_level"]))
    if not pairs:
        return None
    matrix = np.zeros((NUM_MOTION_LEVELS, NUM_MOTION_LEVELS), dtype=np.int64)
    for measured, target in pairs:
        matrix[int(target) - 1, int(measured) - 1] += 1
    return matrix


def plot_motion_confusion(matrix: np.ndarray, path: Path) -> None:
    fig = _figure(5.0, 4.5)
    ax = fig.add_subplot()
    image = ax.imshow(matrix, cmap="Blues")
    levels = np.arange(1, matrix.shape[0] + 1)
    ax.set_xticks(levels - 1, [str(v) for v in levels])
    ax.set_yticks(levels - 1, [str(v) for v in levels])
    ax.set_xlabel("measured level (generated clip)")
    ax.set_ylabel("target level")
    ax.set_title("Motion level confusion")
    threshold = matrix.max() / 2 if matrix.size else 0
    for (i, j), count in np.ndenumerate(matrix):
        ax.text(j, i, str(count), ha="center", va="center", color="white" if count > threshold else "black")
    fig.colorbar(image, ax=ax)
    fig.tight_layout()
    fig.savefig(path)


def plot_state_accuracy(per_state: Mapping[str, Mapping], path: Path, paper_acc: float | None) -> bool:
    items = [(k, v["acc"]) for k, v in per_state.items() if v.get("acc") is not None]
    if not items:
        return False
    fig = _figure(5.0, 4.0)
    ax = fig.add_subplot()
    keys, accs = zip(*items)
    bars = ax.bar(keys, accs, color="tab:blue")
    ax.bar_label(bars, fmt="%.2f")
    if paper_acc is not None:
        ax.axhline(paper_acc, color="tab:red", linestyle="--", label=f"paper ACC-S {paper_acc:.4f}")
        ax.legend(loc="upper right", fontsize="small")  # above the bars: they stop at 1.0
    ax.set_ylim(0, 1.25)
    ax.set_ylabel("accuracy")
    ax.set_title("State accuracy per state")
    fig.tight_layout()
    fig.savefig(path)
    return True


# --------------------------------------------------------------------------- markdown
def _metrics_table(ours: Mapping[str, dict], paper: Mapping[str, float], paper_name: str) -> list[str]:
    keys = [k for k in METRIC_INFO if k in paper or k in ours]
    keys += [k for k in paper if k not in METRIC_INFO]
    lines = [
        f"| Metric | Ours | {paper_name} | Ours - paper | Better |",
        "|---|---|---|---|---|",
    ]
    for key in keys:
        ours_value = ours.get(key)
        paper_value = paper.get(key)
        ours_text = _fmt(key, ours_value) if ours_value is not None else "not measured"
        paper_text = _fmt(key, paper_value) if paper_value is not None else "-"
        delta = "-"
        if metric_value(ours_value) is not None and paper_value is not None:
            delta = f"{metric_value(ours_value) - float(paper_value):+.{METRIC_INFO.get(key, ('', 0, 4))[2]}f}"
        better = ("higher" if METRIC_INFO[key][1] else "lower") if key in METRIC_INFO else "-"
        lines.append(f"| {_label(key)} | {ours_text} | {paper_text} | {delta} | {better} |")
    return lines


def _markdown(
    title: str,
    ours: Mapping[str, dict],
    metrics: Mapping,
    games: Sequence[Mapping],
    paper: Mapping[str, float],
    paper_name: str,
    plots: Mapping[str, Path],
) -> str:
    n_turns = sum(len(g.get("turns", [])) for g in games)
    lines = [f"# {title}", "", f"{len(games)} games, {n_turns} turns. Clips: [gallery.html](gallery.html).", ""]
    lines += ["## Metrics", ""] + _metrics_table(ours, paper, paper_name) + [""]
    shown = set(ours) | set(paper)
    notes = [text for keys, text in _NOTES if shown & set(keys)]
    notes.append('"n/a (reason)" marks a metric that could not be measured (e.g. missing local weights): '
                 "it is not a zero.")
    lines += [" ".join(notes), ""]
    if "consistency_plot" in plots:
        lines += ["## Consistency per turn", "", f"![consistency per turn]({plots['consistency_plot'].name})", ""]
    motion = metrics.get("motion") or {}
    if "motion_plot" in plots or motion:
        lines += ["## Motion", ""]
        if motion.get("flows"):
            flows = np.asarray(motion["flows"], dtype=np.float64)
            lines += [f"Measured flow: mean {flows.mean():.3f}, median {np.median(flows):.3f} px/frame "
                      f"over {flows.size} clips.", ""]
        if "motion_plot" in plots:
            lines += [f"![motion level confusion]({plots['motion_plot'].name})", ""]
    states = metrics.get("states") or {}
    if states.get("per_state"):
        lines += ["## States", "", "| State | ACC | MAE | entries | missing predictions |", "|---|---|---|---|---|"]
        for key, row in states["per_state"].items():
            acc = f"{row['acc']:.4f}" if row.get("acc") is not None else "-"
            mae = f"{row['mae']:.4f}" if row.get("mae") is not None else "-"
            lines.append(f"| {key} | {acc} | {mae} | {row.get('n', '-')} | {row.get('missing', '-')} |")
        lines.append("")
        if "states_plot" in plots:
            lines += [f"![state accuracy]({plots['states_plot'].name})", ""]
    return "\n".join(lines)


# --------------------------------------------------------------------------- gallery
def _video_src(video: Any, out_dir: Path) -> str:
    """A URL relative to the report folder; relative paths are taken as relative to it already."""
    path = Path(str(video))
    if path.is_absolute():
        path = Path(os.path.relpath(path, out_dir.resolve()))
    return quote(path.as_posix())


def _kv(mapping: Mapping | None) -> str:
    if not mapping:
        return "-"
    return ", ".join(f"{html.escape(str(k))}={html.escape(str(v))}" for k, v in mapping.items())


def _turn_metrics(mapping: Mapping | None) -> str:
    if not mapping:
        return "-"
    parts = []
    for key, value in mapping.items():
        if is_metric(value) or (isinstance(value, float)):
            text = _fmt(key, value)
        else:  # levels and counts (ints), labels, anything else as it is
            text = str(value)
        parts.append(f"{html.escape(_label(key))} {html.escape(text)}")
    return "; ".join(parts)


def _gallery(title: str, games: Sequence[Mapping], out_dir: Path) -> str:
    rows = []
    for g, game in enumerate(games):
        cells = []
        for t, turn in enumerate(game.get("turns", []), start=1):
            video = turn.get("video") or turn.get("video_path")
            media = (
                f'<video src="{html.escape(_video_src(video, out_dir))}" controls loop muted '
                f'preload="metadata"></video>' if video else '<div class="novideo">no clip</div>'
            )
            target = turn.get("target_states")
            cells.append(
                '<div class="turn">'
                f"<h3>Turn {t}</h3>{media}"
                f'<p class="instr">{html.escape(str(turn.get("instruction", "")))}</p>'
                + (f'<p class="env">environment: {html.escape(str(turn["environment"]))}</p>'
                   if turn.get("environment") else "")
                + f'<p class="states">states: {_kv(turn.get("states"))}</p>'
                + (f'<p class="states">target: {_kv(target)}</p>' if target else "")
                + f'<p class="metrics">{_turn_metrics(turn.get("metrics"))}</p>'
                "</div>"
            )
        name = html.escape(str(game.get("id", game.get("name", f"game {g + 1}"))))
        rows.append(f'<section class="game"><h2>{name}</h2><div class="turns">{"".join(cells)}</div></section>')
    style = (
        "body{font-family:sans-serif;margin:1em}.turns{display:flex;gap:12px;overflow-x:auto}"
        ".turn{flex:0 0 260px;border:1px solid #ccc;border-radius:6px;padding:6px;font-size:13px}"
        ".turn video{width:100%}.turn h3{margin:0 0 4px 0;font-size:14px}.instr{font-weight:bold}"
        ".metrics{color:#555}.novideo{height:140px;background:#eee;text-align:center;line-height:140px}"
    )
    return (
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\">"
        f"<title>{html.escape(title)}</title><style>{style}</style></head>\n<body>"
        f"<h1>{html.escape(title)}</h1>\n" + "\n".join(rows) + "\n</body></html>\n"
    )


# --------------------------------------------------------------------------- entry point
def write_report(
    out_dir: str | Path,
    metrics: Mapping[str, Any],
    games: Sequence[Mapping],
    paper: Mapping[str, float] = PAPER_TABLE1,
    *,
    title: str = "AnimeGamer evaluation",
    paper_name: str = "Paper (AnimeGamer)",
) -> dict[str, Path]:
    """Write metrics.json, report.md, gallery.html and the plots that have data; return their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ours = headline(metrics)
    written: dict[str, Path] = {}

    plots: dict[str, Path] = {}
    if plot_consistency(games, out / PLOT_FILES["consistency_plot"]):
        plots["consistency_plot"] = out / PLOT_FILES["consistency_plot"]
    matrix = _confusion(metrics, games)
    if matrix is not None:
        plot_motion_confusion(matrix, out / PLOT_FILES["motion_plot"])
        plots["motion_plot"] = out / PLOT_FILES["motion_plot"]
    per_state = (metrics.get("states") or {}).get("per_state") or {}
    if per_state and plot_state_accuracy(per_state, out / PLOT_FILES["states_plot"], paper.get("acc_s")):
        plots["states_plot"] = out / PLOT_FILES["states_plot"]

    payload = {"headline": ours, "paper": dict(paper), "metrics": metrics, "games": list(games)}
    written["metrics_json"] = out / "metrics.json"
    written["metrics_json"].write_text(json.dumps(_jsonable(payload), indent=2, allow_nan=False) + "\n")
    written["report_md"] = out / "report.md"
    written["report_md"].write_text(_markdown(title, ours, metrics, games, paper, paper_name, plots) + "\n")
    written["gallery_html"] = out / "gallery.html"
    written["gallery_html"].write_text(_gallery(title, games, out))
    written.update(plots)
    return written
