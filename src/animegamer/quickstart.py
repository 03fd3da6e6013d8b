"""The quick start, end to end on one CPU: toy film -> pipeline -> phase (a1, a2) -> representations
-> session shards -> phase (b) -> adaptation shards -> phase (c) -> 5-turn games and the evaluation report.

    animegamer quickstart [--out FOLDER] [key=value overrides for every stage]    (or python -m animegamer.quickstart)

Each stage is the same code path as its command (``python -m data_pipeline``, ``train.py``) with the
``quickstart`` experiments; running it again resumes or skips what is already done. ``--out`` puts
everything into another folder than outputs/quickstart/, passed to the stages quoted, so any folder
name works.
"""
from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

from animegamer.errors import UserError, exit_on_user_error
from animegamer.recipe import OUT_NEW_FOLDER, Recipe, out_overrides, run_recipe
from animegamer.utils.command import program_name
from animegamer.utils.logging import setup_logging

QUICKSTART = Recipe(pipeline=["experiment=quickstart"], phase_a=["experiment=quickstart_a"],
                    phase_b=["experiment=quickstart_b"], phase_c=["experiment=quickstart_c"],
                    evaluation=["experiment=quickstart_eval"])


def quickstart_recipe(extra: list[str], out: str | Path | None = None) -> Recipe:
    """The quick start's stages with ``extra`` for every stage; ``out``: the folder everything goes into
    (None: the experiments' outputs/quickstart/, unless ``extra`` moves it)."""
    if out is None:
        return replace(QUICKSTART, extra=list(extra))
    # The folder first: an override of the command line naming pipeline.output or output_dir still wins.
    return replace(QUICKSTART, extra=[*out_overrides(out), *extra], new_folder=OUT_NEW_FOLDER)


def run_quickstart(extra: list[str], out: str | Path | None = None) -> dict:
    return run_recipe(quickstart_recipe(extra, out))


HELP_OPTIONS = ("-h", "--help")
OUT_OPTION = "--out"
HELP = """usage: {prog} [--out FOLDER] [key=value ...]

The quick start, end to end on one CPU: a ~50 s toy cartoon film, the whole pipeline on it with tiny
random-weight encoders, phases (a1), (a2), (b) and (c), the evaluation of the trained game on held-out
shots and a 5-turn game. Everything goes under outputs/quickstart/ (pipeline/, one folder per phase,
eval/report.md, eval/gallery.html, game/index.html); the summary at the end says where each part is.
Running it again resumes or skips what is already done.

  --out FOLDER  put everything under FOLDER instead of outputs/quickstart/ (any folder name)
  key=value     overrides given to every stage, each stage taking those of its own command's keys (the
                pipeline's, train's, eval's), e.g. seed=1 or logger=none; a wrong key or value
                stops it before anything runs
"""


def parse_overrides(prog: str, args: list[str]) -> tuple[str | None, list[str]] | None:
    """``--out``'s folder (None: not given) and the overrides of the command line, or None for ``--help``;
    any other option is refused (Hydra would read it as a malformed override)."""
    if any(a in HELP_OPTIONS for a in args):
        return None
    out, overrides, rest = None, [], iter(args)
    for arg in rest:
        if arg == OUT_OPTION or arg.startswith(OUT_OPTION + "="):
            folder = arg.partition("=")[2] if "=" in arg else next(rest, None)
            if out is not None or not folder:
                raise UserError(f"{prog}: {OUT_OPTION} takes one folder, once ({prog} --help says more)")
            out = folder
        elif arg.startswith("-"):
            raise UserError(f"{prog}: unknown option {arg!r}; it takes {OUT_OPTION} FOLDER and key=value "
                            f"overrides only ({prog} --help says more)")
        else:
            overrides.append(arg)
    return out, overrides


@exit_on_user_error  # a wrong override or a refused setting: its message and exit code 2, no traceback
def main() -> int:
    prog = program_name("animegamer.quickstart")
    parsed = parse_overrides(prog, sys.argv[1:])
    if parsed is None:
        sys.stdout.write(HELP.format(prog=prog))
        return 0
    out, overrides = parsed
    setup_logging("INFO")
    run_quickstart(overrides, out)
    return 0


if __name__ == "__main__":
    main()
