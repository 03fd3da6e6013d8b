"""Fine-tune a trained game on a new film, from existing exports (your own, or the official MLLM).

    python -m animegamer.finetune --film new_film.mp4 --captions new_film.jsonl --from outputs/paper \\
        --out outputs/new_film [--model paper] [--steps A2 B C] [key=value ...]

``--from`` is a run folder holding ``a_joint/export`` and ``b/export`` (the quick start's or the paper
experiments' layout); ``--official-mllm`` starts phase (b) from the official release instead. The
new film goes through the pipeline, then phases (a2), (b) and (c) train with shorter schedules from
those weights (no phase (a1) warm-up: the encoder is already trained). The film's clips are cut at the
size (frames, height, width, fps) those exports were trained at, read from ``a_joint/export``, and the
stages load the frozen weight folders (VAE, decoder base, text and image encoders, MLLM base) those
exports were trained over, unless an override names them. ``--captions`` is the film's caption import;
with ``pipeline.caption.backend`` naming a captioning model (vlm, http) it is left out. Every
``key=value`` after the options is an override for every stage (each takes those its command reads).

Before anything is cut or trained, the fine-tune refuses a film that the ``--from`` exports (or the
exports they were started from) were trained on in another data folder: that folder's held-out shots
are not the fine-tune's, so its evaluation would play shots the model trained on.

Without ``--steps``, each phase trains a share of the steps its ``--from`` export trained (at least one
step; the phase's configured ``phase.max_steps`` where ``--from`` has no export for it): thousands of
steps from the paper's exports, a few from the quick start's tiny ones. The log says, before the
first stage, how long each phase should take at the pace its export trained. When the fine-tuned game
then plays no turn (the evaluation's or the demonstration game's states all malformed), the command
ends with exit code 1 and names the way on (``--constrained-states``, or a longer phase (b)).
"""
from __future__ import annotations

import argparse
import logging
import math
import sys
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

from animegamer.checkpoints.export import EXPORT_FILE
from animegamer.checkpoints.trained_data import lineage, trained_clip_size, trained_preset
from animegamer.config.compose import compose_config, group_options, path_override, quoted
from animegamer.config.disk_checks import read_json_object
from animegamer.config.validate import ConfigError
from animegamer.contracts.exports import TRAIN_SECONDS
from animegamer.errors import MissingInputError, UserError, exit_on_user_error
from animegamer.finetune_checks import caption_problems, frozen_folder_overrides, out_problems, trained_film_problems
from animegamer.phases.specs import A_JOINT, PHASE_B, PHASE_C
from animegamer.pipeline_port import load_pipeline
from animegamer.recipe import (OUT_NEW_FOLDER, ROOTS, Recipe, out_overrides, played_nothing, run_recipe,
                              stage_overrides)
from animegamer.utils.logging import setup_logging

log = logging.getLogger(__name__)

FINETUNED = (A_JOINT, PHASE_B, PHASE_C)  # the phases a fine-tune trains, in the order of --steps
# Each one's default schedule, as a share of the steps its --from export trained: phase (a2) starts from an
# encoder and decoder that already reconstruct clips and meets only the film's look; phases (b) and (c)
# meet its states and the new MLLM's outputs.
STEP_SHARES = {A_JOINT: Fraction(1, 40), PHASE_B: Fraction(1, 10), PHASE_C: Fraction(1, 10)}
# At most this share of a phase's steps warms its learning rate up: a short fine-tune still reaches phase.lr
# (the experiment's warm-up holds for long ones; a phase.warmup_steps override holds for every phase).
WARMUP_SHARE = Fraction(1, 10)
PAPER = "paper"
# The run finished but its game played nothing: a failed result, not a bad input (which exits with 2).
NOTHING_PLAYED_EXIT_CODE = 1
FAILED = "failed"  # the summary's entry saying why the fine-tuned game is unusable


def preset_for(model: str | None, start: Path) -> str:
    """The preset to fine-tune: the one ``--from``'s exports were trained with (their weights fit no other),
    which ``--model`` may name but not contradict; paper when they record none."""
    trained = trained_preset(start / A_JOINT / "export")
    if model and trained and model != trained:
        raise UserError(f"--model {model}, but {start / A_JOINT / 'export'} was trained with model={trained}: "
                        f"its weights fit only that preset (leave --model out to use it)")
    return model or trained or PAPER


def presets() -> list[str]:
    """The model presets a stage can be trained with (configs/model/)."""
    return group_options("model", "train")


@dataclass(frozen=True)
class Schedule:
    """One fine-tuned phase's steps, what they come from, and the seconds they should take at the pace its
    ``--from`` export trained (None: that export records no pace)."""

    phase: str
    steps: int
    basis: str
    seconds: float | None

    def describe(self) -> str:
        cost = f", about {duration(self.seconds)} at the pace its export trained" if self.seconds is not None else ""
        return f"phase {self.phase} {self.steps} step(s) ({self.basis}{cost})"


def duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s" if seconds >= 1 else "under 1 s"


def trained_steps(export: Path, phase: str) -> tuple[int, str, float | None] | None:
    """(steps, export, seconds per step) of the longest run of ``phase`` among ``export`` and the exports it
    was started from (a fine-tune's export is started from the full run); None where none records its steps."""
    runs = []
    for folder, config in lineage(export):
        record = read_json_object(Path(folder) / EXPORT_FILE) or {}
        step, seconds = record.get("step"), record.get(TRAIN_SECONDS)
        if (config.get("phase") or {}).get("name") == phase and isinstance(step, int) and step > 0:
            runs.append((step, folder, seconds / step if isinstance(seconds, (int, float)) and seconds > 0 else None))
    return max(runs, key=lambda run: run[0], default=None)


def schedules(start: Path, model: str, official_mllm: str = "", steps: tuple[int, ...] | None = None) -> list[Schedule]:
    """Each fine-tuned phase's steps: ``steps`` when given, else its share (:data:`STEP_SHARES`) of the steps
    its ``--from`` export trained, or of the preset's configured ``phase.max_steps`` where ``--from`` has
    no export for it (phase (b) from the official MLLM); at least one."""
    planned = []
    for index, phase in enumerate(FINETUNED):
        share = STEP_SHARES[phase]
        export = start / phase / "export"
        trained = None if phase == PHASE_B and official_mllm else trained_steps(export, phase)
        pace = trained[2] if trained else None
        if steps is not None:
            n, basis = steps[index], "--steps"
        elif trained:
            n, basis = max(1, math.ceil(trained[0] * share)), f"{share} of the {trained[0]} steps {trained[1]} trained"
        else:
            configured = int(compose_config("train", [f"model={model}", f"phase={phase}"]).phase.max_steps)
            n = max(1, math.ceil(configured * share))
            basis = f"{share} of phase {phase}'s configured {configured}: no export under --from records its steps"
        planned.append(Schedule(phase, n, basis, n * pace if pace else None))
    return planned


def schedule_overrides(steps: int, configured_warmup: int) -> list[str]:
    """A phase's length, and its warm-up: the experiment's, or :data:`WARMUP_SHARE` of its steps where fewer."""
    warmup = min(configured_warmup, math.floor(steps * WARMUP_SHARE))
    return [f"phase.max_steps={steps}", f"phase.warmup_steps={warmup}"]


def finetune_recipe(film: str, captions: str, start: Path, out: Path, model: str, steps: tuple[int, int, int],
                    official_mllm: str = "", extra: tuple[str, ...] = ()) -> Recipe:
    """The fine-tune's stages; ``captions``: the caption import's file ("": the captions come from the
    backend an override of ``extra`` names). Every path is passed quoted: any character reads back."""
    start_a = start / A_JOINT / "export"
    size = trained_clip_size(start_a)
    if size is None:
        why = "no export.json" if start_a.exists() else f"{start_a} does not exist"
        raise MissingInputError(f"{start_a}: not an export folder ({why}); --from names a run folder "
                                f"holding a_joint/export and b/export")
    common = ["experiment=finetune_film", f"model={model}", *out_overrides(out), *size.overrides()]
    configured = int(compose_config("train", ["experiment=finetune_film", f"model={model}"]).phase.warmup_steps)
    a_steps, b_steps, c_steps = (schedule_overrides(n, configured) for n in steps)
    start_b = "" if official_mllm else str(start / "b" / "export")
    phase_b = [*common, "phase=b", *b_steps]
    if official_mllm:
        phase_b.append(path_override("model.mllm.official_checkpoint", official_mllm))
    return Recipe(  # each command takes the common settings it reads
        pipeline=[*stage_overrides("pipeline", common), f"pipeline.inputs=[{quoted(film)}]",
                  *([path_override("pipeline.caption.path", captions)] if captions else [])],
        phase_a=[*common, *a_steps],
        phase_b=phase_b,
        phase_c=[*common, "phase=c", *c_steps],
        evaluation=[*stage_overrides("evaluate", common), "evaluation.games=2"],
        start_a=str(start_a),
        start_b=start_b,
        extra=list(extra),
        new_folder=OUT_NEW_FOLDER,  # an output_dir override would put every stage into one folder
    )


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.replace("``", ""),  # reST marks are not for a terminal
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--film", required=True, help="the new film, or a folder of films")
    parser.add_argument("--captions", default="",
                        help="caption-import JSONL of the film (docs/pipeline.md); left out when "
                             "pipeline.caption.backend names a captioning model (vlm, http)")
    parser.add_argument("--from", dest="start", metavar="RUN", type=Path, required=True,
                        help="run folder with a_joint/ and b/ exports")
    parser.add_argument("--out", type=Path, required=True,
                        help="the fine-tune's run folder (pipeline/, one folder per phase, eval/, game/)")
    parser.add_argument("--model", default=None, choices=presets(),
                        help="model preset (default: the one --from's exports were trained with, else paper)")
    shares = ", ".join(f"{STEP_SHARES[phase]} ({phase})" for phase in FINETUNED)
    parser.add_argument("--steps", type=int, nargs=3, default=None, metavar=("A2", "B", "C"),
                        help=f"phase.max_steps of phases (a2), (b) and (c) (default: {shares} of the steps each "
                             f"--from export trained, at least 1; the log says what they will cost)")
    parser.add_argument("--official-mllm", default="",
                        help="official MLLM pytorch_model.bin for phase (b) (default: --from's b/export)")
    parser.add_argument("--constrained-states", action="store_true",
                        help="evaluate and play with state decoding constrained to the layout (default: free "
                             "decoding, which a briefly trained MLLM may leave malformed)")
    parser.usage = parser.format_usage().removeprefix("usage: ").rstrip() + " [key=value ...]"
    parser.epilog = ("key=value: a Hydra override for every stage, each taking those its command reads (e.g. "
                     "pipeline.sessions.turns=2 data.val_fraction=0.5 pipeline.caption.backend=vlm)")
    args, overrides = parser.parse_known_args(argv)
    options = [o for o in overrides if o.startswith("-")]  # the rest are Hydra overrides (key=value)
    if options:
        parser.error(f"unrecognized arguments: {' '.join(options)}")
    for root in ROOTS:  # each stage takes those its command reads: an unknown key or value refused before any work
        compose_config(root, stage_overrides(root, overrides))
    setup_logging("INFO")
    film_run = compose_config("pipeline", ["experiment=finetune_film", f"pipeline.inputs=[{quoted(args.film)}]",
                                           *stage_overrides("pipeline", overrides)])
    problems = out_problems(args.start, args.out)
    problems += caption_problems(args.captions, str(film_run.pipeline.caption.backend), overrides)
    if problems:
        raise ConfigError(problems)
    model = preset_for(args.model, args.start)
    plan = schedules(args.start, model, args.official_mllm, args.steps)
    extra = (*frozen_folder_overrides(args.start, model, overrides), *overrides)
    recipe = finetune_recipe(args.film, args.captions, args.start, args.out, model, tuple(s.steps for s in plan),
                             args.official_mllm, extra)
    if args.constrained_states:
        recipe.evaluation.append("model.mllm.constrained_states=true")
    evaluated = compose_config("evaluate", [*recipe.evaluation, *stage_overrides("evaluate", list(extra))])
    exports = [args.start / A_JOINT / "export", *([] if args.official_mllm else [args.start / PHASE_B / "export"])]
    films = load_pipeline().inputs(film_run)
    problems = trained_film_problems(films, args.start, exports, evaluated)
    if problems:
        raise ConfigError(problems)
    known = [s.seconds for s in plan if s.seconds is not None]
    total = f"; about {duration(sum(known))} of training in all" if len(known) == len(plan) else ""
    log.info("fine-tune schedule (--steps A2 B C sets it): %s%s", "; ".join(s.describe() for s in plan), total)
    summary = run_recipe(recipe)
    failure = nothing_played_failure(summary, args.constrained_states)
    if failure:
        summary[FAILED] = failure
        log.error(failure)
    return summary


def nothing_played_failure(summary: dict, constrained: bool) -> str | None:
    """Why the fine-tuned game is unusable, with the way on, when its evaluation or its demonstration game
    planned turns and played none (None: it played)."""
    empty = played_nothing(summary)
    if not empty:
        return None
    longer = "train phase (b) longer (a larger B in --steps resumes it)"
    way = longer if constrained else (f"run the same command again with --constrained-states (the states decoded "
                                      f"within the layout; the trained stages are reused), or {longer}")
    return (f"the fine-tuned game played no turn in {' and '.join(empty)}: its state generations were malformed "
            f"(the log names each): {way}")


def cli() -> None:
    """The ``animegamer-finetune`` console script: a user error is one message and exit code 2; a game that
    played no turn, its error and exit code 1 (:data:`NOTHING_PLAYED_EXIT_CODE`)."""
    summary = exit_on_user_error(main)(sys.argv[1:])
    if summary.get(FAILED):
        raise SystemExit(NOTHING_PLAYED_EXIT_CODE)


if __name__ == "__main__":
    cli()
