"""Fine-tune a trained game on a new film, from existing exports (your own, or the official MLLM).

    python -m animegamer.finetune --film new_film.mp4 --captions new_film.jsonl --from outputs/paper \\
        --out outputs/new_film [--model paper] [--steps 2000 1500 1000] [hydra overrides...]

``--from`` is a run folder holding ``a_joint/export`` and ``b/export`` (the quick start's or the paper
experiments' layout); ``--official-mllm`` starts phase (b) from the official release instead. The
new film goes through the pipeline, then phases (a2), (b) and (c) train with shorter schedules from
those weights (no phase (a1) warm-up: the encoder is already trained). The film's clips are cut at the
size (frames, height, width, fps) those exports were trained at, read from ``a_joint/export``.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from animegamer.config.trained_data import trained_clip_size, trained_preset
from animegamer.errors import MissingInputError
from animegamer.errors import exit_on_user_error
from animegamer.phases.specs import A_JOINT
from animegamer.recipe import Recipe, run_recipe
from animegamer.utils.logging import setup_logging

DEFAULT_STEPS = (2000, 1500, 1000)  # phases a2, b, c: a tenth of the paper's schedules or less
PRESETS = ("tiny", "paper")
PAPER = "paper"


def preset_for(model: str | None, start: Path) -> str:
    """The preset to fine-tune: the one ``--from``'s exports were trained with (their weights fit no other),
    which ``--model`` may name but not contradict; paper when they record none."""
    from animegamer.errors import UserError

    trained = trained_preset(start / A_JOINT / "export")
    if model and trained and model != trained:
        raise UserError(f"--model {model}, but {start / A_JOINT / 'export'} was trained with model={trained}: "
                        f"its weights fit only that preset (leave --model out to use it)")
    return model or trained or PAPER


def finetune_recipe(film: str, captions: str, start: Path, out: Path, model: str, steps: tuple[int, int, int],
                    official_mllm: str = "", extra: tuple[str, ...] = ()) -> Recipe:
    start_a = start / A_JOINT / "export"
    size = trained_clip_size(start_a)
    if size is None:
        raise MissingInputError(f"{start_a}: not an export folder (no export.json); --from names a run folder "
                                f"holding a_joint/export and b/export")
    common = ["experiment=finetune_film", f"model={model}", f"pipeline.output={out}/pipeline",
              f"output_dir={out}/" + "${phase.name}", *size.overrides()]
    start_b = "" if official_mllm else str(start / "b" / "export")
    phase_b = [*common, "phase=b", f"phase.max_steps={steps[1]}"]
    if official_mllm:
        phase_b.append(f"model.mllm.official_checkpoint={official_mllm}")
    return Recipe(
        pipeline=[*common, f"pipeline.inputs=['{film}']", f"pipeline.caption.path='{captions}'"],
        phase_a=[*common, f"phase.max_steps={steps[0]}"],
        phase_b=phase_b,
        phase_c=[*common, "phase=c", f"phase.max_steps={steps[2]}"],
        evaluation=[*common, "evaluation.games=2"],
        start_a=str(start_a),
        start_b=start_b,
        extra=list(extra),
    )


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--film", required=True)
    parser.add_argument("--captions", required=True, help="caption-import JSONL of the film (README)")
    parser.add_argument("--from", dest="start", type=Path, required=True, help="run folder with a_joint/ and b/ exports")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--model", default=None, choices=PRESETS,
                        help="model preset (default: the one --from's exports were trained with, else paper)")
    parser.add_argument("--steps", type=int, nargs=3, default=DEFAULT_STEPS, metavar=("A2", "B", "C"))
    parser.add_argument("--official-mllm", default="", help="official MLLM pytorch_model.bin for phase (b)")
    parser.add_argument("--constrained-states", action="store_true",
                        help="evaluate and play with state decoding constrained to the layout")
    args, overrides = parser.parse_known_args(argv)
    options = [o for o in overrides if o.startswith("-")]  # the rest are Hydra overrides (key=value)
    if options:
        parser.error(f"unrecognized arguments: {' '.join(options)}")
    setup_logging("INFO")
    model = preset_for(args.model, args.start)
    recipe = finetune_recipe(args.film, args.captions, args.start, args.out, model, tuple(args.steps),
                             args.official_mllm, tuple(overrides))
    if args.constrained_states:
        recipe.evaluation.append("model.mllm.constrained_states=true")
    return run_recipe(recipe)


def cli() -> None:
    """The ``animegamer-finetune`` console script: a user error is one message and exit code 2."""
    exit_on_user_error(main)(sys.argv[1:])


if __name__ == "__main__":
    cli()
