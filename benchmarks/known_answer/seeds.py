"""Several seeds of one known-answer variant summarised: each row's metrics over the seeds, and the trained
model against every other row measured against the seed-to-seed spread.

    python -m benchmarks.known_answer.seeds OUT1 OUT2 ... --out DIR

Each ``OUT`` is one run of the benchmark (``python -m benchmarks.known_answer OUT --seed N ...``, e.g. one
folder per seed of ``scripts/known_answer_gpu_sweep.sh``), all of one variant: the same size and caption
words, each seed once. Writes ``DIR/seeds.json`` and ``DIR/seeds.md``:

* per row and metric, over the seeds that have it: n, the mean, the sample standard deviation and the
  min-max (a row that only some seeds have carries its n);
* the trained game (and its reconstruction) against each other row of its kind, per metric, paired seed
  by seed: the mean of the per-seed differences (trained minus other: the difference of the two rows'
  seed means over the seeds that have both), their standard deviation (the seed spread of the margin),
  and whether the mean exceeds twice that spread; the reconstructions' ``sweep_rho`` against the
  no-motion-scope ablation's is named on its own (does the motion scope control the rendered speed?).

``DIR/motion_sweep_seeds.png`` shows the motion sweep of every evaluation folder of ``OUT/seed_N/`` that has
one (the full model's ``eval``, an ablation's ``eval_ablation_<name>``), one panel per model, its seeds
pooled: each clip's measured speed at every requested level flow, and each seed's mean per level.
"""
from __future__ import annotations

import argparse
import json
import logging
import statistics
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from animegamer.contracts.files import METRICS_FILE
from animegamer.errors import InvalidInputError, MissingInputError, UserError, exit_on_user_error
from animegamer.evaluation.drawing import figure, markdown_row
from animegamer.evaluation.motion_sweep import LATENT_SHIFT, PERSISTENCE, PIXEL_FLOW, UNITS, find, rank_correlation
from animegamer.evaluation.report import read_evaluation
from animegamer.metrics.baselines import UNTRAINED
from animegamer.utils.io import read_json_object
from animegamer.utils.logging import setup_logging
from animegamer.utils.text import doc_summary
from benchmarks.known_answer.data import CAPTION_WORDS_MEANING, LEVEL_WORDS, TRUTH_WORDS_KEY
from benchmarks.known_answer.driver import RESULT_FILE, Layout
from benchmarks.known_answer.report import LOWER_IS_BETTER, RECONSTRUCTION, comparisons

log = logging.getLogger(__name__)

SUMMARY_FILE = "seeds.json"
TABLE_FILE = "seeds.md"
PLOT_FILE = "motion_sweep_seeds.png"
# The untrained game's label names where its MLLM started (its seed, or its init_from path): another label
# in every seed for the same row, so across seeds it goes by this name.
UNTRAINED_ROW = "untrained game (MLLM at phase (b)'s start)"
NO_MOTION_SCOPE = "no_motion_scope"  # the ablation (driver.ABLATIONS) without the motion-scope input
SWEEP_RHO = "sweep_rho"
# The comparison named on its own: the full model's reconstruction against the same without the motion scope.
MOTION_SCOPE_OTHER = f"ablation {NO_MOTION_SCOPE}: {RECONSTRUCTION}"
MOTION_SCOPE_COMPARISON = f"{RECONSTRUCTION}: {SWEEP_RHO}"
SPREAD_FACTOR = 2.0  # a difference of seed means counts when it exceeds this many seed spreads
MIN_SEEDS = 2  # a spread needs at least two seeds
SWEEP_MEASURES = (PIXEL_FLOW, LATENT_SHIFT, *PERSISTENCE)  # the plot's rows, when measured


# --------------------------------------------------------------------------- reading
def read_result(folder: Path) -> dict:
    """``folder``'s known_answer.json, checked for what the summary reads; its rows named as across seeds."""
    path = folder / RESULT_FILE
    if not path.is_file():
        raise MissingInputError(f"{folder}: no {RESULT_FILE} (not the OUT folder of a known-answer benchmark run)")
    try:
        result = read_json_object(path, ("size", "seed", "rows"))
        if not isinstance(result["seed"], int) or isinstance(result["seed"], bool):
            raise TypeError(f"seed {result['seed']!r} is not an integer")
        if not isinstance(result["rows"], list) or not all(
                isinstance(r, dict) and isinstance(r.get("row"), str) and isinstance(r.get("metrics"), dict)
                for r in result["rows"]):
            raise TypeError("rows is not a list of {row, metrics} objects")
        for r in result["rows"]:
            if any(not isinstance(v, (int, float)) or isinstance(v, bool)
                   for v in r["metrics"].values() if v is not None):
                raise TypeError(f"row {r['row']!r} has a metric that is neither a number nor null")
    except (ValueError, KeyError, TypeError) as error:
        raise InvalidInputError(f"{path}: not a known-answer result ({type(error).__name__}: {error})") from error
    result["rows"] = [{**r, "row": row_name(r)} for r in result["rows"]]
    return result


def row_name(row: Mapping[str, Any]) -> str:
    """A row's name across seeds: its label, the untrained game's without where its MLLM started."""
    return UNTRAINED_ROW if row.get("baseline") == UNTRAINED else row["row"]


def caption_words(result: Mapping[str, Any]) -> str:
    return result.get(TRUTH_WORDS_KEY, LEVEL_WORDS)  # results from before the choice: level words


def read_results(folders: Sequence[Path]) -> dict[int, tuple[Path, dict]]:
    """Each folder's result by its seed; refuses a repeated seed, or another size or caption words than the
    first folder's (one summary is one variant), naming the folder."""
    found: dict[int, tuple[Path, dict]] = {}
    first: tuple[Path, dict] | None = None
    for folder in folders:
        result = read_result(folder)
        seed = result["seed"]
        if seed in found:
            raise UserError(f"{folder}: seed {seed} again (also {found[seed][0]}); give each seed once")
        if first is not None:
            for what, value, expected in (("size", result["size"], first[1]["size"]),
                                          ("caption words", caption_words(result), caption_words(first[1]))):
                if value != expected:
                    raise UserError(f"{folder}: {what} {value!r}, but {first[0]} has {expected!r}; one summary is "
                                    "one variant: summarise each apart")
        else:
            first = (folder, result)
        found[seed] = (folder, result)
    return dict(sorted(found.items()))


def read_sweeps(folder: Path, seed: int) -> dict[str, dict]:
    """Each evaluation folder of the seed's runs (``OUT/seed_N/<evaluation>/``) that holds a motion sweep,
    by folder name; none where the runs were not kept."""
    runs = Layout(folder, seed).runs
    found = {}
    for evaluation in sorted(p for p in runs.glob("*") if (p / METRICS_FILE).is_file()):
        record = read_evaluation(evaluation, f"{evaluation} is not an evaluation", required=("metrics",))
        sweep = find(record["metrics"])
        if sweep and any((sweep.get("measures") or {}).get(name, {}).get("values") for name in SWEEP_MEASURES):
            check_sweep(sweep, evaluation / METRICS_FILE)
            found[evaluation.name] = sweep
    return found


def check_sweep(sweep: Mapping[str, Any], path: Path) -> None:
    """A sweep the plot can draw: a measured value per requested level flow for every clip, and a mean per level."""
    levels = len(sweep.get("requested") or [])
    for name in SWEEP_MEASURES:
        measure = sweep["measures"].get(name) or {}
        if not measure.get("values"):
            continue
        rows = [*measure["values"], measure.get("mean_per_level")] if isinstance(measure["values"], list) else [None]
        if any(not isinstance(row, list) or len(row) != levels for row in rows):
            raise InvalidInputError(f"{path}: its motion sweep's {name} does not give one value per requested level "
                                    f"({levels}) for every clip and for the mean")


# --------------------------------------------------------------------------- statistics
def spread(values: Sequence[float]) -> dict[str, Any]:
    """n, mean, sample standard deviation (None under two values), min and max."""
    return {"n": len(values), "mean": statistics.fmean(values),
            "sd": statistics.stdev(values) if len(values) >= MIN_SEEDS else None,
            "min": min(values), "max": max(values)}


def row_summaries(results: Mapping[int, dict]) -> list[dict]:
    """Per row (in the order the seeds first give them) and metric: the values by seed and their spread."""
    rows: dict[str, dict] = {}
    for seed, result in results.items():
        for r in result["rows"]:
            entry = rows.setdefault(r["row"], {"row": r["row"], "n": 0, "seeds": [], "metrics": {}})
            entry["seeds"].append(seed)
            for key, value in r["metrics"].items():
                if value is not None:
                    entry["metrics"].setdefault(key, {"values": {}})["values"][seed] = float(value)
    for entry in rows.values():
        entry["n"] = len(entry["seeds"])
        for metric in entry["metrics"].values():
            metric.update(spread(list(metric["values"].values())))
    return list(rows.values())


def paired(differences: Mapping[int, float], lower_is_better: bool) -> dict[str, Any]:
    """The trained row against one other over the seeds that have both: the mean of the per-seed
    differences (trained minus other), their sample standard deviation (the seed spread of the margin), and
    whether the mean exceeds :data:`SPREAD_FACTOR` spreads (never under :data:`MIN_SEEDS` seeds)."""
    values = list(differences.values())
    mean = statistics.fmean(values)
    sd = statistics.stdev(values) if len(values) >= MIN_SEEDS else None
    better = "equal" if mean == 0 else ("trained" if (mean < 0) == lower_is_better else "other")
    return {"n": len(values), "differences": dict(differences), "difference": mean, "spread": sd,
            "exceeds_twice_spread": sd is not None and abs(mean) > SPREAD_FACTOR * sd, "better": better}


def seed_comparisons(results: Mapping[int, dict]) -> dict[str, dict[str, dict]]:
    """Per metric of the trained game (and of its reconstruction), each other row of its kind
    (:func:`benchmarks.known_answer.report.comparisons`, seed by seed) paired over the seeds (:func:`paired`)."""
    differences: dict[str, dict[str, dict[int, float]]] = {}
    for seed, result in results.items():
        for name, others in comparisons(result["rows"]).items():
            for other, entry in others.items():
                differences.setdefault(name, {}).setdefault(other, {})[seed] = entry["trained"] - entry["value"]
    return {name: {other: paired(by_seed, name.rsplit(": ", 1)[1] in LOWER_IS_BETTER)
                   for other, by_seed in others.items()}
            for name, others in differences.items()}


def sweep_panels(sweeps: Mapping[int, Mapping[str, dict]]) -> dict[str, dict[str, dict]]:
    """Per evaluation folder and measure, every seed's sweep (requested flows, values per clip, mean per
    level) and the rank correlation of requested against measured speed over all seeds' clips."""
    panels: dict[str, dict[str, dict]] = {}
    for seed, found in sweeps.items():
        for model, sweep in found.items():
            for name in SWEEP_MEASURES:
                measure = sweep["measures"].get(name) or {}
                if measure.get("values"):
                    panel = panels.setdefault(model, {}).setdefault(name, {"seeds": {}})
                    panel["seeds"][seed] = {"requested": list(sweep["requested"]), "values": measure["values"],
                                            "mean_per_level": measure["mean_per_level"]}
    for measures in panels.values():
        for panel in measures.values():
            requested = [r for s in panel["seeds"].values() for _ in s["values"] for r in s["requested"]]
            measured = [v for s in panel["seeds"].values() for row in s["values"] for v in row]
            panel["clips"] = sum(len(s["values"]) for s in panel["seeds"].values())
            panel["pooled_rank_correlation"] = rank_correlation(requested, measured)
    return panels


# --------------------------------------------------------------------------- writing
def plot_sweeps(panels: Mapping[str, Mapping[str, dict]], path: Path) -> bool:
    """Requested against measured speed, one panel per model (columns) and measure (rows), the seeds
    pooled: each clip's speed at each level as a point, each seed's mean per level as a line."""
    measures = [name for name in SWEEP_MEASURES if any(name in m for m in panels.values())]
    if not measures:
        return False
    fig = figure(4.5 * len(panels), 4.0 * len(measures))
    for column, (model, found) in enumerate(panels.items()):
        for line, name in enumerate(measures):
            if name not in found:
                continue
            panel = found[name]
            ax = fig.add_subplot(len(measures), len(panels), line * len(panels) + column + 1)
            for index, (seed, sweep) in enumerate(panel["seeds"].items()):
                color = f"C{index % 10}"
                requested = np.asarray(sweep["requested"], dtype=np.float64)
                values = np.asarray(sweep["values"], dtype=np.float64)
                ax.scatter(np.broadcast_to(requested, values.shape).ravel(), values.ravel(), s=10, alpha=0.3,
                           color=color)
                ax.plot(requested, sweep["mean_per_level"], color=color, marker="o", linewidth=2,
                        label=f"seed {seed}: mean over clips")
            if name == PIXEL_FLOW:  # the same unit on both axes: where a clip moving as asked would lie
                flows = sorted({r for s in panel["seeds"].values() for r in s["requested"]})
                ax.plot(flows, flows, color="gray", linestyle="--", linewidth=1, label="as requested")
            rho = panel["pooled_rank_correlation"]
            ax.set_title(f"{model}\n{name.replace('_', ' ')}: rho {'n/a' if rho is None else f'{rho:.2f}'} "
                         f"({_seeds(len(panel['seeds']))}, {panel['clips']} clips)", fontsize="medium")
            ax.set_xlabel("requested flow (level's median, px/frame)")
            ax.set_ylabel(UNITS[name].split(" (")[0])
            ax.grid(alpha=0.3)
            ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path)
    return True


def _seeds(n: int) -> str:
    return f"{n} seed" if n == 1 else f"{n} seeds"


def _number(value: float | None) -> str:
    return "" if value is None else f"{value:.3f}"


def verdict(entry: Mapping[str, Any]) -> str:
    """A comparison in words."""
    if entry["n"] < MIN_SEEDS:
        return f"{_seeds(entry['n'])}: no spread to judge by"
    return "exceeds twice the seed spread" if entry["exceeds_twice_spread"] else "within it"


def markdown(summary: Mapping[str, Any], plot_name: str | None) -> str:
    seeds = summary["seeds"]
    words = summary[TRUTH_WORDS_KEY]
    lines = [f"# Known-answer benchmark over {_seeds(len(seeds))}", "",
             f"Size {summary['size']}, captions with {words} words ({CAPTION_WORDS_MEANING[words]}), seeds "
             f"{', '.join(map(str, seeds))}. Per row and metric: n (the seeds that have it), the mean, the sample "
             "standard deviation over the seeds and their min-max. A row that only some seeds have says how many.", "",
             "| row | metric | n | mean | sd | min | max |", "|---|---|---:|---:|---:|---:|---:|"]
    for row in summary["rows"]:
        label = row["row"] if row["n"] == len(seeds) else f"{row['row']} ({row['n']} of {len(seeds)} seeds)"
        for key, m in sorted(row["metrics"].items()):
            lines.append(markdown_row(label, key, m["n"], _number(m["mean"]), _number(m["sd"]), _number(m["min"]),
                                      _number(m["max"])))
    motion = summary["motion_scope"]
    lines += ["", "## The trained model against each row", "",
              "Per metric, seed by seed: the difference trained minus other (its mean over the n seeds that have "
              "both: the difference of their seed means), the standard deviation of those per-seed differences "
              f"(the seed spread), and whether the mean exceeds {SPREAD_FACTOR:g} spreads. Lower is better for "
              f"{', '.join(sorted(LOWER_IS_BETTER))}; higher for the rest.", ""]
    if motion is None:
        lines += [f"Motion scope: no seed has both {RECONSTRUCTION}'s and {MOTION_SCOPE_OTHER}'s {SWEEP_RHO}.", ""]
    else:
        lines += [f"Motion scope: {RECONSTRUCTION}'s {SWEEP_RHO} minus {MOTION_SCOPE_OTHER}'s is "
                  f"{motion['difference']:+.3f} over {_seeds(motion['n'])} (seed spread "
                  f"{_number(motion['spread']) or 'n/a'}): {verdict(motion)}.", ""]
    lines += ["| trained | metric | against | n | difference | seed spread | better | in words |",
              "|---|---|---|---:|---:|---:|---|---|"]
    for name, others in summary["comparisons"].items():
        reference, key = name.rsplit(": ", 1)
        for other, entry in others.items():
            lines.append(markdown_row(reference, key, other, entry["n"], f"{entry['difference']:+.3f}",
                                      _number(entry["spread"]), entry["better"], verdict(entry)))
    if plot_name:
        lines += ["", "## Motion sweep, seeds pooled", "",
                  "Each evaluation's reconstructions decoded at every level's flow value: each clip's measured speed "
                  "(points) and each seed's mean per level (lines); rho: Spearman's over every seed's clips. A panel "
                  "per evaluation folder of the seeds' runs: `eval` the full model's, `eval_ablation_<name>` an "
                  "ablation's.", "",
                  f"![motion sweep over the seeds]({plot_name})"]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- all of it
def summarise(folders: Sequence[Path], out: Path) -> dict[str, Any]:
    """Read every folder (refusing bad input before anything is written), then write the summary, its
    table and, where sweeps were kept, their plot into ``out``; returns the summary."""
    found = read_results([Path(f) for f in folders])
    results = {seed: result for seed, (_, result) in found.items()}
    sweeps = {seed: read_sweeps(folder, seed) for seed, (folder, _) in found.items()}
    first = next(iter(results.values()))
    table = seed_comparisons(results)
    summary = {
        "size": first["size"], TRUTH_WORDS_KEY: caption_words(first), "seeds": list(results),
        "folders": {seed: str(folder) for seed, (folder, _) in found.items()},
        "overrides": {seed: result.get("overrides", []) for seed, result in results.items()},
        "rows": row_summaries(results), "comparisons": table,
        "motion_scope": table.get(MOTION_SCOPE_COMPARISON, {}).get(MOTION_SCOPE_OTHER),
        "motion_sweep": sweep_panels(sweeps),
    }
    out.mkdir(parents=True, exist_ok=True)
    plotted = plot_sweeps(summary["motion_sweep"], out / PLOT_FILE)
    summary["files"] = {"plot": str(out / PLOT_FILE) if plotted else None}
    (out / SUMMARY_FILE).write_text(json.dumps(summary, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    (out / TABLE_FILE).write_text(markdown(summary, PLOT_FILE if plotted else None), encoding="utf-8")
    log.info("%d seeds summarised -> %s", len(results), out / SUMMARY_FILE)
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.known_answer.seeds", description=doc_summary(__doc__))
    parser.add_argument("folders", nargs="+", type=Path, metavar="OUT", help="a benchmark run's folder, one per seed")
    parser.add_argument("--out", type=Path, required=True, help="folder for seeds.json, seeds.md and the sweep plot")
    args = parser.parse_args(argv)
    setup_logging("INFO")
    exit_on_user_error(summarise)(args.folders, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
