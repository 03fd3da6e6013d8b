"""Table 3 of the paper in one command: every tokenizer/de-tokenizer variant trained as its own model,
then scored with the reconstruction metrics into one comparison table.

    animegamer ablate [--out outputs/paper/table3] [--only addition no_warmup ...] \\
        [--steps A1 A2] [hydra overrides for every stage]

(``python -m animegamer.ablations`` takes the same arguments.)

The variants are the baseline (``paper_a_joint``) and every ``configs/train/experiment/ablation_a_*.yaml``.
For each, phase (a1) (the warm-up) then phase (a2) train into ``<out>/<variant>/a_warmup`` and
``<out>/<variant>/a_joint``:

- a variant whose experiment clears ``phase.init_from`` (``no_warmup``) skips the warm-up;
- a variant whose warm-up would train exactly what the baseline's does (same model, phase and data
  settings) starts from the baseline's warm-up;
- every other variant (a changed encoder, decoder or conditioning frame) warms up on its own, since
  the warm-up trains the very modules it changes.

Each a2 export is then scored like ``evaluate.py``'s reconstruction report (held-out clips decoded
from their own representation; CLIP-I, DreamSim, PSNR, ACC-F and MAE-F, and the same clips decoded from
another clip's representation) into ``<out>/<variant>/reconstruction/``, and ``<out>/table3.md`` /
``table3.json`` set all variants beside the paper's numbers, with each metric's gap to the shuffled
representation; a metric that was not measured says why in a footnote. Running it again
resumes an interrupted stage, skips finished ones and re-scores only where the export or what it is
scored with (evaluation settings, held-out data, seed, sampling steps: :func:`scored_with`) changed.
"""
from __future__ import annotations

import argparse
import difflib
import json
import logging
import sys
from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf

from animegamer.checkpoints.export_checks import check_export_sizes
from animegamer.checkpoints.trained_data import clip_manifest_sha256
from animegamer.config.compose import compose_config, group_options, path_override
from animegamer.config.validate import ConfigError
from animegamer.config.schema import INIT_FROM_KEY
from animegamer.contracts.files import METRICS_FILE, TRAINED_FILE
from animegamer.errors import UserError, exit_on_user_error
from animegamer.evaluation.preflight import check_evaluated_exports
from animegamer.evaluation.report import METRIC_INFO, PAPER_TABLE3_RECONSTRUCTION
from animegamer.evaluation.runner import RECONSTRUCTION_FOLDER, Scorers, write_reconstruction
from animegamer.metrics.baselines import SHUFFLED
from animegamer.metrics.common import as_metric, available, format_metric
from animegamer.phases.preflight import validate_train_run
from animegamer.phases.specs import A_JOINT, A_WARMUP
from animegamer.recipe import OUT_NEW_FOLDER, check_recipe, evaluation_of, stage_overrides, train_stage
from animegamer.utils.io import read_json, sha256_file, write_json_atomic
from animegamer.utils.command import program_name
from animegamer.utils.logging import setup_logging

log = logging.getLogger(__name__)

BASELINE = "baseline"
BASELINE_EXPERIMENT = "paper_a_joint"
TRAIN, EVALUATE, EXPERIMENT = "train", "evaluate", "experiment"  # the roots the variants compose; their group
ABLATION_PREFIX = "ablation_a_"
DEFAULT_OUT = Path("outputs/paper/table3")
TABLE_NAME = "table3"
OWN, NONE = "own", "none"  # warm-up: its own, none; else the name of the variant whose warm-up it shares
# What the warm-up trains on, and with: two variants equal here share one warm-up.
WARMUP_KEYS = ("model", "phase", "data", "pipeline")
PAPER_METRICS = ("clip_i", "dreamsim")  # the paper's Table 3 columns
# The table's columns: every reconstruction metric the report measures (CLIP-I and DreamSim need local
# weights; PSNR and ACC-F / MAE-F need none, so a CPU run has numbers).
METRICS = (*PAPER_METRICS, "psnr", "acc_f", "mae_f")
MINUS_SHUFFLED = "minus_shuffled"  # table3.json: per metric, the variant's score minus the shuffled baseline's
SCORED_WITH = "scored_with"  # metrics.json's record of what the scores depend on besides the export


def variant_names() -> list[str]:
    """The baseline first, then every phase (a) ablation experiment of the train command."""
    found = sorted(n.removeprefix(ABLATION_PREFIX) for n in group_options(EXPERIMENT, TRAIN)
                   if n.startswith(ABLATION_PREFIX))
    return [BASELINE, *found]


def experiment_of(name: str) -> str:
    return BASELINE_EXPERIMENT if name == BASELINE else ABLATION_PREFIX + name


@dataclass
class Variant:
    name: str
    warmup: str  # OWN, NONE or the variant whose warm-up it shares
    folder: Path

    @property
    def experiment(self) -> str:
        return experiment_of(self.name)

    def stage(self, phase: str, extra: list[str], steps: int = 0, init_from: str = "") -> list[str]:
        """Train overrides of one stage of this variant, into its own folder (of ``extra``, those of the train
        root); every folder quoted, so any ``--out`` name reaches the stage as it is."""
        return [f"experiment={self.experiment}", f"phase={phase}", path_override(INIT_FROM_KEY, init_from),
                *stage_overrides(TRAIN, extra),
                *([f"phase.max_steps={steps}"] if steps else []), path_override("output_dir", self.folder / phase)]

    def scoring(self, extra: list[str]) -> list[str]:
        """Evaluate overrides scoring this variant's a2 export (of ``extra``, those of the evaluate root)."""
        return [*stage_overrides(EVALUATE, extra),
                path_override("evaluation.reconstruction_export", self.export(A_JOINT)),
                path_override("evaluation.out", self.folder)]

    def export(self, phase: str) -> str:
        return str(self.folder / phase / "export")


def _trained(cfg) -> dict:
    return {key: OmegaConf.to_container(cfg[key], resolve=True) for key in WARMUP_KEYS}


def plan(names: list[str], out: Path, extra: list[str]) -> list[Variant]:
    """Which warm-up each variant starts from; the baseline is always planned (others may share its warm-up)."""
    names = [BASELINE, *[n for n in names if n != BASELINE]]
    unknown = sorted(set(names) - set(variant_names()))
    if unknown:
        raise ConfigError([f"unknown Table 3 variant(s) {unknown}: choose from {variant_names()}"])
    trained = stage_overrides(TRAIN, extra)
    warmup = lambda name: _trained(compose_config(TRAIN, [f"experiment={experiment_of(name)}", "phase=a_warmup",
                                                          "phase.init_from=''", *trained, "output_dir=."]))
    baseline = warmup(BASELINE)
    variants = []
    for name in names:
        joint = compose_config(TRAIN, [f"experiment={experiment_of(name)}", *trained])
        if not joint.phase.init_from:
            kind = NONE
        elif name != BASELINE and warmup(name) == baseline:
            kind = BASELINE
        else:
            kind = OWN
        variants.append(Variant(name, kind, out / name))
    return variants


def preflight(variants: list[Variant], extra: list[str], steps: tuple[int, int]) -> None:
    """Every stage's config and data, checked before the first one trains (the a2 stages without
    the warm-up export they will start from, which does not exist yet)."""
    found: dict[str, list[str]] = {}  # a problem -> the stages that have it (a setting they share: all)
    checked = []
    for v in variants:
        stages = [(A_JOINT, steps[1])] + ([(A_WARMUP, steps[0])] if v.warmup == OWN else [])
        for phase, n in stages:
            checked.append(f"{v.name} {phase}")
            try:
                validate_train_run(compose_config(TRAIN, v.stage(phase, extra, n)))
            except ConfigError as error:
                for problem in error.problems:
                    found.setdefault(problem, []).append(checked[-1])
    if found:
        raise ConfigError([f"{'every stage' if len(names) == len(checked) > 1 else ', '.join(names)}: {problem}"
                           for problem, names in found.items()])
    for v in variants:
        joint = compose_config(TRAIN, v.stage(A_JOINT, extra, steps[1]))
        check_recipe(joint, evaluation=evaluation_of(joint, stage_overrides(EVALUATE, extra)), run=v.name)


def scored_with(composed) -> dict:
    """What a variant's reconstruction scores depend on besides its export: the evaluation settings (not
    where the variant's folder and export are, so a copied or moved ``--out`` keeps its scores), the
    held-out data (the folder, absolute; its split; its clip manifest's digest), the seed and the model
    settings (the sampler's steps, guidance and step cache among them)."""
    data = composed.data
    evaluation = OmegaConf.to_container(composed.evaluation, resolve=True)
    for where in ("out", "reconstruction_export"):  # the variant's folder and export (digested apart): moved, the same
        evaluation.pop(where)
    return {"evaluation": evaluation,
            "data": {"root": str(Path(data.root).resolve()), "clips": data.clips, "val_fraction": data.val_fraction,
                     "clip_manifest_sha256": clip_manifest_sha256(data.root, data.clips)},
            "seed": composed.seed, "model": OmegaConf.to_container(composed.model, resolve=True)}


def saved_scores(done: Path, digest: str, settings: dict) -> dict | None:
    """The metrics in ``done`` when they scored the export of sha256 ``digest`` with ``settings``."""
    saved = read_json(done)["metrics"] if done.exists() else {}
    return saved if saved.get("export_sha256") == digest and saved.get(SCORED_WITH) == settings else None


def score(v: Variant, extra: list[str]) -> dict:
    """The reconstruction metrics of the variant's a2 export (kept while neither it nor
    :func:`scored_with` changed)."""
    export = v.export(A_JOINT)
    digest = sha256_file(Path(export) / TRAINED_FILE)
    out = v.folder / RECONSTRUCTION_FOLDER
    composed = evaluation_of(compose_config(TRAIN, v.stage(A_JOINT, extra)), v.scoring(extra))
    settings = scored_with(composed)
    done = out / METRICS_FILE
    saved = saved_scores(done, digest, settings)
    if saved is not None:
        log.info("%s: reconstruction metrics of this export are already in %s", v.name, done)
        return saved
    problems = check_export_sizes("evaluation.reconstruction_export", export, composed.model)
    problems += check_evaluated_exports(composed, ("reconstruction_export",))
    if problems:
        raise ConfigError(problems)
    cfg = OmegaConf.to_object(composed)
    return write_reconstruction(cfg, Scorers(cfg), out, {"export_sha256": digest, SCORED_WITH: settings})


def _metric(row: dict, key: str) -> dict:
    """The row's ``key`` as a metric dict (a score saved before the report measured it: not measured)."""
    return as_metric(row.get(key))


def minus_shuffled(row: dict) -> dict[str, dict]:
    """Per metric, the variant's score minus the shuffled-representation baseline's on the same clips:
    how much each clip's own representation tells the decoder (unavailable, with the reason, where
    either side is)."""
    shuffled = (row.get("baselines") or {}).get(SHUFFLED) or {}
    gaps = {}
    for key in METRICS:
        own, other = _metric(row, key), _metric(shuffled, key)
        gaps[key] = (own if not own["available"] else other if not other["available"]
                     else available(own["value"] - other["value"]))
    return gaps


class Footnotes:
    """Table cells for metrics: a value, or "n/a [n]" with footnote n giving the reason (each reason once)."""

    def __init__(self) -> None:
        self.reasons: list[str] = []

    def cell(self, key: str, metric: dict, signed: bool = False) -> str:
        if metric["available"]:
            return f"{metric['value']:{'+' if signed else ''}.{METRIC_INFO[key][2]}f}"
        reason = str(metric.get("reason") or "unavailable")
        if reason not in self.reasons:
            self.reasons.append(reason)
        return f"n/a [{self.reasons.index(reason) + 1}]"

    def lines(self) -> list[str]:
        return [f"[{n}] {reason}" for n, reason in enumerate(self.reasons, start=1)]


def _cell(metric: dict | None) -> str:
    """A metric for the log: its value, or n/a with the reason."""
    return format_metric(metric)


def table_markdown(table: dict) -> str:
    """``table3.md``: the variants' metrics beside the paper's, then their gaps to the shuffled representation;
    every metric not measured is "n/a" with a footnote saying why."""
    labels = [METRIC_INFO[m][0] for m in METRICS]
    notes = Footnotes()
    lines = ["# AnimeGamer Table 3: tokenizer / de-tokenizer ablations (reconstruction)", "",
             "Held-out clips decoded from their own representation by each variant's phase (a2) export.", "",
             "| variant | warm-up | clips | " + " | ".join(labels) + " | "
             + " | ".join(f"paper {METRIC_INFO[m][0]}" for m in PAPER_METRICS) + " |",
             "|---|---|---:|" + "---:|" * (len(METRICS) + len(PAPER_METRICS))]
    for row in table["variants"]:
        ref = table["paper"].get(row["variant"], {})
        cells = [notes.cell(m, _metric(row, m)) for m in METRICS]
        cells += [f"{ref[m]:.{METRIC_INFO[m][2]}f}" if m in ref else "not recorded" for m in PAPER_METRICS]
        lines.append(f"| {row['variant']} | {row['warmup']} | {row['clips']} | " + " | ".join(cells) + " |")
    lines += ["", "## Own minus shuffled representation", "",
              "Each clip decoded from its own representation minus the same clip decoded (same noise and motion "
              "scope) from another held-out clip's: above zero (below, for MAE-F), the decoder uses what the "
              "representation says of the clip.", "",
              "| variant | " + " | ".join(labels) + " |", "|---|" + "---:|" * len(METRICS)]
    for row in table["variants"]:
        lines.append(f"| {row['variant']} | " + " | ".join(notes.cell(m, row[MINUS_SHUFFLED][m], signed=True)
                                                            for m in METRICS) + " |")
    lines += ["", "warm-up: own = the variant's own phase (a1); none = no warm-up; baseline = the baseline's "
              "(the variant's warm-up would train the same). The repository records the paper's numbers for "
              "the baseline only; its ablation rows are left \"not recorded\" rather than copied by hand. "
              "Higher is better for every metric but MAE-F."]
    if notes.reasons:
        lines += ["", "Not measured (n/a):", "", *(f"- {line}" for line in notes.lines())]
    return "\n".join(lines) + "\n"


def write_table(out: Path, rows: dict[str, dict], variants: list[Variant]) -> dict[str, Path]:
    """``table3.md`` and ``table3.json``: every variant's metrics beside the paper's Table 3 numbers."""
    paper = {BASELINE: PAPER_TABLE3_RECONSTRUCTION}
    warmups = {v.name: v.warmup for v in variants}
    table = {"paper": paper, "variants": [
        {"variant": name, "warmup": warmups[name], "export": row["export"], "clips": row["clips"],
         **{m: _metric(row, m) for m in METRICS}, MINUS_SHUFFLED: minus_shuffled(row)} for name, row in rows.items()]}
    files = {"md": out / f"{TABLE_NAME}.md", "json": out / f"{TABLE_NAME}.json"}
    files["md"].write_text(table_markdown(table))
    write_json_atomic(files["json"], table)
    return files


def run_table3(out: Path, names: list[str], extra: list[str], steps: tuple[int, int] = (0, 0)) -> dict:
    """Train what is missing, score every variant and write the comparison table; returns its content."""
    variants = plan(names, out, extra)
    preflight(variants, extra, steps)
    out.mkdir(parents=True, exist_ok=True)  # only once every stage passed its checks: a refusal writes nothing
    rows: dict[str, dict] = {}
    by_name = {v.name: v for v in variants}
    for v in variants:
        start = ""
        if v.warmup == OWN:
            start = train_stage(v.stage(A_WARMUP, extra, steps[0]), OUT_NEW_FOLDER)["export"]
        elif v.warmup != NONE:
            start = by_name[v.warmup].export(A_WARMUP)
        train_stage(v.stage(A_JOINT, extra, steps[1], init_from=start), OUT_NEW_FOLDER)
        rows[v.name] = score(v, extra)
    files = write_table(out, rows, variants)
    log.info("Table 3: %s (%s)", files["md"], ", ".join(f"{n}: PSNR {_cell(r.get('psnr'))} dB, CLIP-I "
                                                        f"{_cell(r.get('clip_i'))}" for n, r in rows.items()))
    return json.loads(files["json"].read_text())


def _closest(word: str, choices: list[str]) -> str:
    match = difflib.get_close_matches(word, choices, n=1)
    return f"did you mean {match[0]!r}? " if match else ""


def check_command_line(prog: str, parser: argparse.ArgumentParser, only: list[str] | None,
                       overrides: list[str]) -> None:
    """An unknown option or variant, or a word that is neither an option nor an override (Hydra would read it as a
    malformed override), refused before anything runs."""
    known = variant_names()
    for word in overrides:
        if word.startswith("-"):
            options = [o for action in parser._actions for o in action.option_strings if o.startswith("--")]
            raise UserError(f"{prog}: unknown option {word!r}; {_closest(word.split('=')[0], options)}"
                            f"options: {', '.join(options)}")
        if "=" not in word and not word.startswith("~"):  # ~key (Hydra's deletion) is the one override without '='
            hint = f"variants go after --only ({prog} --only {word}); " if word in known else ""
            raise UserError(f"{prog}: {word!r} is neither an option nor a key=value override; {hint}"
                            f"see {prog} --help")
    if only == []:
        raise UserError(f"{prog}: --only names no variant; variants: {', '.join(known)}")
    for name in only or []:
        if name not in known:
            raise UserError(f"{prog}: no Table 3 variant {name!r}; {_closest(name, known)}variants: {', '.join(known)}")


def main(argv: list[str] | None = None) -> dict:
    prog = program_name("animegamer.ablations")
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.replace("``", ""),  # no reST marks in a terminal
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="one folder per variant, and the table")
    parser.add_argument("--only", nargs="+", default=None, metavar="VARIANT",
                        help=f"these variants (and the baseline) only; all: {' '.join(variant_names())}")
    parser.add_argument("--steps", type=int, nargs=2, default=(0, 0), metavar=("A1", "A2"),
                        help="phase.max_steps of the warm-up and joint stages (0: the experiments')")
    args, overrides = parser.parse_known_args(argv)
    # --only takes every word up to the next option, so overrides written after its variants land in it
    only = None if args.only is None else [n for n in args.only if "=" not in n]
    overrides = [*(n for n in args.only or [] if "=" in n), *overrides]
    check_command_line(prog, parser, only, overrides)
    setup_logging("INFO")
    return run_table3(args.out, only or variant_names(), overrides, tuple(args.steps))


if __name__ == "__main__":
    exit_on_user_error(main)(sys.argv[1:])
