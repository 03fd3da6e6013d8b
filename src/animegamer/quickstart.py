"""The quick start, end to end on one CPU: toy film -> pipeline -> phase (a1, a2) -> representations
-> session shards -> phase (b) -> adaptation shards -> phase (c).

    python -m animegamer.quickstart [extra overrides for every stage]

Each stage is the same code path as its command (``python -m data_pipeline``, ``train.py``) with the
``quickstart`` experiments; running it again resumes or skips what is already done.
"""
from __future__ import annotations

import logging
import sys
from pathlib import Path

from animegamer.config.compose import compose_config
from animegamer.utils.logging import setup_logging

log = logging.getLogger("animegamer.quickstart")


def run_quickstart(extra: list[str]) -> dict:
    from animegamer.training.runner import run as run_train
    from data_pipeline.__main__ import run as run_pipeline

    pipeline = run_pipeline(compose_config("pipeline", ["experiment=quickstart", *extra]))
    warmup = run_train(compose_config("train", ["experiment=quickstart_a", "phase=a_warmup", *extra]))
    joint = run_train(compose_config("train", ["experiment=quickstart_a", "phase=a_joint",
                                               f"phase.init_from={warmup['export']}", *extra]))
    reps = run_pipeline(compose_config("pipeline", ["experiment=quickstart",
                                                    "pipeline.steps=[representations,session_shards]",
                                                    f"pipeline.representations.export={joint['export']}", *extra]))
    game = run_train(compose_config("train", ["experiment=quickstart_b", *extra]))
    adaptation = run_pipeline(compose_config("pipeline", ["experiment=quickstart", "pipeline.steps=[adaptation]",
                                                          f"pipeline.adaptation.export={game['export']}", *extra]))
    adapted = run_train(compose_config("train", ["experiment=quickstart_c", f"phase.init_from={joint['export']}",
                                                 *extra]))
    summary = {
        "clip shards": pipeline["output"],
        "report": str(Path(pipeline["output"]).parent / "report.json"),
        "features": pipeline["features"]["output"],
        "sessions": pipeline["sessions"]["output"],
        "phase a1 export": warmup["export"],
        "phase a2 export": joint["export"],
        "phase a2 val/loss": joint["metrics"].get("val/loss"),
        "representations": reps["representations"]["output"],
        "session shards": reps["session_shards"]["output"],
        "phase b export": game["export"],
        "phase b val/state_accuracy": game["metrics"].get("val/state_accuracy"),
        "adaptation shards": adaptation["adaptation"]["output"],
        "phase c export": adapted["export"],
    }
    for name, value in summary.items():
        log.info("%-18s %s", name, value)
    return summary


def main() -> None:
    setup_logging("INFO")
    run_quickstart(sys.argv[1:])


if __name__ == "__main__":
    main()
