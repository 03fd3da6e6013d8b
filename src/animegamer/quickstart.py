"""The quick start, end to end on one CPU: toy film -> pipeline -> phase (a1, a2) -> representations
-> session shards -> phase (b) -> adaptation shards -> phase (c) -> 5-turn games and the evaluation report.

    python -m animegamer.quickstart [extra overrides for every stage]

Each stage is the same code path as its command (``python -m data_pipeline``, ``train.py``) with the
``quickstart`` experiments; running it again resumes or skips what is already done.
"""
from __future__ import annotations

import sys

from animegamer.errors import exit_on_user_error
from animegamer.recipe import Recipe, run_recipe
from animegamer.utils.logging import setup_logging

QUICKSTART = Recipe(pipeline=["experiment=quickstart"], phase_a=["experiment=quickstart_a"],
                    phase_b=["experiment=quickstart_b"], phase_c=["experiment=quickstart_c"],
                    evaluation=["experiment=quickstart_eval"])


def run_quickstart(extra: list[str]) -> dict:
    return run_recipe(Recipe(**{**QUICKSTART.__dict__, "extra": list(extra)}))


@exit_on_user_error  # a wrong override or a refused setting: its message and exit code 2, no traceback
def main() -> None:
    setup_logging("INFO")
    run_quickstart(sys.argv[1:])


if __name__ == "__main__":
    main()
