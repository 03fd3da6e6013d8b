"""The quick start, end to end on one CPU: toy film -> pipeline -> phase (a1, a2) -> representations
-> session shards -> phase (b) -> adaptation shards -> phase (c) -> 5-turn games and the evaluation report.

    animegamer quickstart [key=value overrides for every stage]    (or python -m animegamer.quickstart)

Each stage is the same code path as its command (``python -m data_pipeline``, ``train.py``) with the
``quickstart`` experiments; running it again resumes or skips what is already done.
"""
from __future__ import annotations

import sys

from animegamer.errors import UserError, exit_on_user_error
from animegamer.recipe import Recipe, run_recipe
from animegamer.utils.command import program_name
from animegamer.utils.logging import setup_logging

QUICKSTART = Recipe(pipeline=["experiment=quickstart"], phase_a=["experiment=quickstart_a"],
                    phase_b=["experiment=quickstart_b"], phase_c=["experiment=quickstart_c"],
                    evaluation=["experiment=quickstart_eval"])


def run_quickstart(extra: list[str]) -> dict:
    return run_recipe(Recipe(**{**QUICKSTART.__dict__, "extra": list(extra)}))


HELP_OPTIONS = ("-h", "--help")
HELP = """usage: {prog} [key=value ...]

The quick start, end to end on one CPU: a ~50 s toy cartoon film, the whole pipeline on it with tiny
random-weight encoders, phases (a1), (a2), (b) and (c), the evaluation of the trained game on held-out
shots and a 5-turn game. Everything goes under outputs/quickstart/ (pipeline/, one folder per phase,
eval/report.md, eval/gallery.html, game/index.html); the summary at the end says where each part is.
Running it again resumes or skips what is already done.

  key=value  overrides given to every stage, each stage taking those of its own command's keys (the
             pipeline's, train's, eval's), e.g. seed=1 or logger=none; a wrong key or value
             stops it before anything runs
"""


def parse_overrides(prog: str, args: list[str]) -> list[str] | None:
    """The overrides of the command line, or None for ``--help``; an option is refused (Hydra would read it as a
    malformed override)."""
    if any(a in HELP_OPTIONS for a in args):
        return None
    options = [a for a in args if a.startswith("-")]
    if options:
        raise UserError(f"{prog}: unknown option {options[0]!r}; it takes key=value overrides only "
                        f"({prog} --help says more)")
    return args


@exit_on_user_error  # a wrong override or a refused setting: its message and exit code 2, no traceback
def main() -> int:
    prog = program_name("animegamer.quickstart")
    overrides = parse_overrides(prog, sys.argv[1:])
    if overrides is None:
        sys.stdout.write(HELP.format(prog=prog))
        return 0
    setup_logging("INFO")
    run_quickstart(overrides)
    return 0


if __name__ == "__main__":
    main()
