"""Evaluation report: ``metrics.json``, ``report.md`` (ours beside the paper's numbers), PNG plots and
``gallery.html`` (every game as a row of its turns' clips, instructions and states).

``metrics`` holds the headline metrics under the keys of ``METRIC_INFO`` (plain numbers or
``available``/``unavailable`` dicts) and optionally the detail dicts ``"motion"`` (from
``motion_accuracy``) and ``"states"`` (from ``state_accuracy``); a headline ACC-F/MAE-F/ACC-S/MAE-S
missing at the top level is read from those. ``metrics["setup"]`` (``animegamer.metrics.setup``)
says what produced the numbers; ``metrics["clips"]`` counts the clips of a report without games (the
reconstruction report). ``metrics["baselines"]`` (``animegamer.metrics.baselines``: name ->
{"label", headline metric keys}) become rows of a "Baselines" table beside ours. ``games`` is a list of
``{"id": str (optional), "turns": [{"instruction", "video" (generated mp4), "truth_video" (optional:
the held-out clip the turn stands for), "states" (predicted), "target_states" (optional),
"environment" (optional), "metrics" {per-turn metrics}}]}``; clip paths are as this process sees them
(absolute, or relative to the current directory) and are written relative to the report folder, so
the folder can be moved. The per-turn keys the plots read are ``clip_i``, ``dreamsim``, ``clip_t``,
``clip_t_env`` and, when there is no ``metrics["motion"]``, ``motion_level`` / ``target_level``.
"""
from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from animegamer.config.schema import NUM_MOTION_LEVELS
from animegamer.contracts.files import GAME_PAGE_FILE, METRICS_FILE
from animegamer.contracts.states import MOTION_LEVEL
from animegamer.errors import InvalidInputError, MissingInputError
from animegamer.evaluation import motion_sweep
from animegamer.evaluation.drawing import figure, markdown_row
from animegamer.evaluation.judge_record import table2_lines
from animegamer.metrics.common import as_metric, format_metric, is_metric, metric_value
from animegamer.metrics.setup import format_count
from animegamer.pages import clip_entry, relative_path, write_page
from animegamer.utils.io import read_json_object
from animegamer.utils.text import count_of

logger = logging.getLogger(__name__)

# The paper's Table 1 row for AnimeGamer (its game benchmark). DreamSim is a similarity (higher is better).
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
# Where the paper's numbers come from: the full-size model, whose sizes are this framework's `paper` model preset.
PAPER_SETUP = ("the full-size AnimeGamer (a Mistral-7B MLLM and a CogVideoX-2B decoder, this framework's "
               "`model=paper` preset), measured by the paper's authors on their hardware")
VIDEO_KEYS = ("video", "truth_video")  # per-turn clip paths: generated, ground truth
CLIP_LABELS = {"video": "generated", "truth_video": "ground truth (held-out clip)"}
GALLERY_FILE = "gallery.html"
GALLERY_TEMPLATE = "gallery.html.j2"

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
    "psnr": ("PSNR (dB)", True, 2),
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
    (("psnr",), "PSNR: each generated (or reconstructed) clip against its ground-truth clip, 8-bit frames, "
     "mean over clips in dB (an identical clip scores the cap, 100 dB)."),
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
    return METRIC_INFO[key][0] if key in METRIC_INFO else key.replace("_", " ")


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
    fig = figure()
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
    fig = figure(5.0, 4.5)
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
    fig = figure(5.0, 4.0)
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
def _scope_counts(metrics: Mapping, games: Sequence[Mapping]) -> str:
    """What the numbers were measured on: "2 games, 4 turns" or "2 clips"."""
    if games:
        turns = sum(len(g.get("turns", [])) for g in games)
        return f"{count_of(len(games), 'game')}, {count_of(turns, 'turn')}"
    return count_of(int(metrics.get("clips") or 0), "clip")


def _storyboard_links(games: Sequence[Mapping], out: Path) -> list[str]:
    """A markdown link to each played game's storyboard page (beside its clips), relative to ``out``."""
    pages = [(game["id"], Path(game["turns"][0]["video"]).parent / GAME_PAGE_FILE)
             for game in games if game.get("turns")]
    return [f"[{name}]({relative_path(page, out)})" for name, page in pages if page.is_file()]


def _scope(metrics: Mapping, games: Sequence[Mapping]) -> str:
    if games:
        return (f"{_scope_counts(metrics, games)}. Clips: [{GALLERY_FILE}]({GALLERY_FILE}) (each generated clip "
                "beside the held-out clip it stands for, where the benchmark has one).")
    return (f"{_scope_counts(metrics, games)}: held-out clips, each decoded from its own representation and "
            "compared with the true clip.")


def _setup_lines(setup: Mapping | None, counts: str) -> list[str]:
    """Who produced which numbers: ours (preset, parameters, precision, hardware) and the paper's."""
    if setup:
        sizes = ", ".join(f"{label} {format_count(int(n))}" for label, n in setup["parameters"].items())
        steps = f", {setup['sampling_steps']} sampling steps per clip" if setup.get("sampling_steps") else ""
        steps += f" with the step cache {setup['sampling_cache']}" if setup.get("sampling_cache") else ""
        cpu = f"; CPU {setup['cpu']}" if setup.get("cpu") and setup["cpu"] != setup["hardware"] else ""
        ours = (f"- Ours: model preset `{setup['model']}` ({sizes} parameters), {setup['dtype']} on "
                f"{setup['device']} ({setup['hardware']}{cpu}), torch {setup['torch']}{steps}; {counts}.")
    else:
        ours = f"- Ours: {counts} (model and hardware not recorded)."
    paper = (f"- Paper: {PAPER_SETUP}. Unless ours is the `paper` preset on similar GPUs, \"Ours - paper\" "
             "compares models of different sizes, and Time (s/turn) also compares different hardware.")
    return ["## Setup", "", ours, paper, ""]


def _metrics_table(ours: Mapping[str, dict], paper: Mapping[str, float], paper_name: str,
                   ours_name: str = "Ours") -> list[str]:
    keys = [k for k in METRIC_INFO if k in paper or k in ours]
    keys += [k for k in paper if k not in METRIC_INFO]
    lines = [
        f"| Metric | {ours_name} | {paper_name} | Ours - paper | Better |",
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
        lines.append(markdown_row(_label(key), ours_text, paper_text, delta, better))
    return lines


def _baselines_table(ours: Mapping[str, dict], baselines: Mapping[str, Mapping], ours_name: str,
                     ours_states: Mapping | None = None) -> list[str]:
    """Ours and every baseline (``metrics["baselines"]``: name -> {"label", metric keys}) as rows, one
    column per headline metric some baseline carries."""
    keys = [k for k in METRIC_INFO if any(k in b for b in baselines.values())]
    if not keys:
        return []
    lines = ["## Baselines", "", "Computed in this evaluation, on the same clips and turns, with the same metrics.", "",
             "| | " + " | ".join(_label(k) for k in keys) + " |", "|---" * (len(keys) + 1) + "|",
             markdown_row(f"{ours_name}{_unpredicted(ours_states)}",
                          *(_fmt(k, ours[k]) if k in ours else "-" for k in keys))]
    for name, row in baselines.items():
        cells = [_fmt(k, as_metric(row[k])) if k in row else "-" for k in keys]
        lines.append(markdown_row(f"{row.get('label', name)}{_unpredicted(row.get('states'))}", *cells))
    return lines + [""]


def _unpredicted(states: Mapping | None) -> str:
    """What a row's state scores leave out: values without a prediction (a game's first turn for the
    copy-the-last-turn baseline) count as wrong in ACC-S and are not in MAE-S."""
    if not states or not states.get("missing"):
        return ""
    return (f" ({states['missing']} of {states['n']} state values without a prediction: wrong in ACC-S, "
            f"not in MAE-S)")


def _requested_line(motion: Mapping, per_state: Mapping) -> str:
    """ACC-F split in two: how often the renderer drew the level the game model asked for, and how often
    that was the true level (the model's motion-level prediction)."""
    line = (f"Rendered at the level the game model asked for: {motion['acc_f_requested']:.3f} of the clips "
            f"(ACC-F counts the true level instead")
    asked = per_state.get(MOTION_LEVEL) or {}
    if asked.get("acc") is not None:
        line += f"; the model asked for the true level in {asked['acc']:.3f} of the turns"
    return line + ")."


def _markdown(
    title: str,
    ours: Mapping[str, dict],
    metrics: Mapping,
    games: Sequence[Mapping],
    paper: Mapping[str, float],
    paper_name: str,
    plots: Mapping[str, Path],
    storyboards: Sequence[str] = (),
) -> str:
    setup = metrics.get("setup")
    lines = [f"# {title}", "", _scope(metrics, games), ""]
    if storyboards:
        lines += [f"Each game turn by turn, with its state bars: {', '.join(storyboards)}.", ""]
    lines += _setup_lines(setup, _scope_counts(metrics, games))
    ours_name = f"Ours (`{setup['model']}`)" if setup else "Ours"
    lines += ["## Metrics", ""] + _metrics_table(ours, paper, paper_name, ours_name) + [""]
    shown = set(ours) | set(paper)
    notes = [text for keys, text in _NOTES if shown & set(keys)]
    notes.append('"n/a (reason)" marks a metric that could not be measured (e.g. missing local weights): '
                 "it is not a zero.")
    lines += [" ".join(notes), ""]
    lines += _baselines_table(ours, metrics.get("baselines") or {}, ours_name, metrics.get("states"))
    if metrics.get("judge"):
        lines += table2_lines(metrics["judge"]) + [""]
    if "consistency_plot" in plots:
        lines += ["## Consistency per turn", "", f"![consistency per turn]({plots['consistency_plot'].name})", ""]
    motion = metrics.get("motion") or {}
    if "motion_plot" in plots or motion:
        lines += ["## Motion", ""]
        if motion.get("flows"):
            flows = np.asarray(motion["flows"], dtype=np.float64)
            lines += [f"Measured flow: mean {flows.mean():.3f}, median {np.median(flows):.3f} px/frame "
                      f"over {flows.size} clips.", ""]
        if motion.get("acc_f_requested") is not None:
            lines += [_requested_line(motion, (metrics.get("states") or {}).get("per_state", {})), ""]
        if "motion_plot" in plots:
            lines += [f"![motion level confusion]({plots['motion_plot'].name})", ""]
    sweep = motion_sweep.find(metrics)
    if sweep:
        lines += motion_sweep.markdown(sweep, plots["sweep_plot"].name if "sweep_plot" in plots else None)
    states = metrics.get("states") or {}
    if states.get("per_state"):
        lines += ["## States", "", "| State | ACC | MAE | entries | missing predictions |", "|---|---|---|---|---|"]
        for key, row in states["per_state"].items():
            acc = f"{row['acc']:.4f}" if row.get("acc") is not None else "-"
            mae = f"{row['mae']:.4f}" if row.get("mae") is not None else "-"
            lines.append(markdown_row(key, acc, mae, row.get("n", "-"), row.get("missing", "-")))
        lines.append("")
        if "states_plot" in plots:
            lines += [f"![state accuracy]({plots['states_plot'].name})", ""]
    return "\n".join(lines)


# --------------------------------------------------------------------------- gallery
def _turn_clips(turn: Mapping) -> dict[str, str]:
    """The turn's clip paths by key (``video``, ``truth_video``); ``video_path`` is read as ``video``."""
    clips = {"video": turn.get("video") or turn.get("video_path"), "truth_video": turn.get("truth_video")}
    return {key: str(path) for key, path in clips.items() if path}


def _portable(games: Sequence[Mapping], out_dir: Path) -> list[dict]:
    """The games with every clip path relative to the report folder (what metrics.json records)."""
    def turn_paths(turn: Mapping) -> dict:
        paths = {k: relative_path(p, out_dir) for k, p in _turn_clips(turn).items()}
        return {**{k: v for k, v in turn.items() if k != "video_path"}, **paths}

    return [{**game, "turns": [turn_paths(t) for t in game.get("turns", [])]} for game in games]


def _kv(mapping: Mapping | None) -> str:
    return ", ".join(f"{k}={v}" for k, v in mapping.items()) if mapping else "-"


def _not_measured(games: Sequence[Mapping]) -> list[dict]:
    """The per-turn metrics that were unavailable, grouped by reason: the gallery says each reason once."""
    by_reason: dict[str, list[str]] = {}
    for game in games:
        for turn in game.get("turns", []):
            for key, value in (turn.get("metrics") or {}).items():
                if is_metric(value) and not value["available"]:
                    labels = by_reason.setdefault(str(value.get("reason") or "unavailable"), [])
                    if _label(key) not in labels:
                        labels.append(_label(key))
    return [{"metrics": labels, "reason": reason} for reason, labels in by_reason.items()]


def _turn_metrics(mapping: Mapping | None) -> list[str]:
    """The measured per-turn values (unavailable ones are in the page's note, not on every card)."""
    parts = []
    for key, value in (mapping or {}).items():
        if is_metric(value) and not value["available"]:
            continue
        # levels and counts (ints) and labels as they are
        text = _fmt(key, value) if is_metric(value) or isinstance(value, float) else str(value)
        parts.append(f"{_label(key)} {text}")
    return parts


def _gallery_turn(number: int, turn: Mapping, out_dir: Path) -> dict:
    clips = _turn_clips(turn)
    return {"number": number, "instruction": str(turn.get("instruction", "")),
            "clips": [clip_entry(clips[key], out_dir, CLIP_LABELS[key]) for key in VIDEO_KEYS if key in clips],
            "environment": turn.get("environment"), "states": _kv(turn.get("states")),
            "target": _kv(turn["target_states"]) if turn.get("target_states") else None,
            "metrics": _turn_metrics(turn.get("metrics"))}


def write_gallery(path: Path, title: str, games: Sequence[Mapping], meta: Sequence[str] = ()) -> Path:
    """Every game as a row of turn cards: the generated clip beside the ground truth, with posters."""
    rows = [{"name": str(game.get("id", game.get("name", f"game {g + 1}"))), "stopped": game.get("stopped"),
             "completed": game.get("completed"), "planned": game.get("planned"),
             "turns": [_gallery_turn(t, turn, path.parent) for t, turn in enumerate(game.get("turns", []), start=1)]}
            for g, game in enumerate(games)]
    return write_page(path, GALLERY_TEMPLATE, title=title, meta=list(meta), not_measured=_not_measured(games),
                      games=rows)


# --------------------------------------------------------------------------- entry point
def read_evaluation(folder: str | Path, hint: str, required: Sequence[str] = ("games",)) -> dict:
    """``metrics.json`` of an evaluation folder, the one way it is read back: a JSON object holding the
    ``required`` keys, whose ``games`` (when there) is a list of objects and ``metrics`` an object.
    ``hint`` says, after "missing; ", which folder the reader wanted. A missing file is a
    :class:`MissingInputError`, anything else that is not such a record an :class:`InvalidInputError`,
    both naming the file."""
    path = Path(folder) / METRICS_FILE
    if not path.is_file():
        raise MissingInputError(f"{path}: missing; {hint}")
    try:
        record = read_json_object(path, required)
        games, metrics = record.get("games", []), record.get("metrics", {})
        if not isinstance(games, list) or not all(isinstance(game, dict) for game in games):
            raise TypeError("games is not a list of objects")
        if not isinstance(metrics, dict):
            raise TypeError("metrics is not an object")
    except (ValueError, KeyError, TypeError) as error:
        raise InvalidInputError(f"{path}: not an evaluation record ({type(error).__name__}: {error})") from error
    return record


def write_report(
    out_dir: str | Path,
    metrics: Mapping[str, Any],
    games: Sequence[Mapping],
    paper: Mapping[str, float] = PAPER_TABLE1,
    *,
    title: str = "AnimeGamer evaluation",
    paper_name: str = "Paper (AnimeGamer)",
) -> dict[str, Path]:
    """Write metrics.json, report.md, the plots that have data and, when there are games, gallery.html;
    return their paths. A plot or gallery of an earlier report in ``out_dir`` that this one does not write is
    removed."""
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
    sweep = motion_sweep.find(metrics)
    if sweep and motion_sweep.plot(sweep, out / motion_sweep.PLOT_FILE):
        plots["sweep_plot"] = out / motion_sweep.PLOT_FILE

    payload = {"headline": ours, "paper": dict(paper), "metrics": metrics, "games": _portable(games, out)}
    written["metrics_json"] = out / METRICS_FILE
    written["metrics_json"].write_text(json.dumps(_jsonable(payload), indent=2, allow_nan=False) + "\n")
    written["report_md"] = out / "report.md"
    markdown = _markdown(title, ours, metrics, games, paper, paper_name, plots, _storyboard_links(games, out))
    written["report_md"].write_text(markdown + "\n")
    if games:
        written["gallery_html"] = write_gallery(out / GALLERY_FILE, title, games, [_scope_counts(metrics, games)])
    else:
        (out / GALLERY_FILE).unlink(missing_ok=True)
    # A plot of an earlier report in this folder that this one has no data for would sit beside it unlinked.
    for name in (*PLOT_FILES.values(), motion_sweep.PLOT_FILE):
        if out / name not in plots.values():
            (out / name).unlink(missing_ok=True)
    written.update(plots)
    return written
