"""Run the offline data pipeline on films.

``python -m data_pipeline [hydra overrides]``, also ``animegamer pipeline`` and the console script
``animegamer-pipeline``.
"""
from __future__ import annotations

import logging

import hydra
from omegaconf import DictConfig, OmegaConf

from animegamer.config.compose import config_dir, run_command
from animegamer.errors import INTERRUPTED_EXIT_CODE, exit_on_user_error
from animegamer.utils.http import redact
from animegamer.utils.logging import setup_logging
from data_pipeline.config_checks import validate_pipeline_run
from data_pipeline.run import run_pipeline

log = logging.getLogger("data_pipeline")


def run(cfg: DictConfig) -> dict:
    setup_logging(cfg.log_level)
    validate_pipeline_run(cfg)
    # What the manifests record: a password or query key in a URL (pipeline.caption.url) is masked.
    resolved = redact(OmegaConf.to_container(cfg, resolve=True))
    typed = OmegaConf.to_object(cfg)
    report = run_pipeline(typed.pipeline, resolved, typed.model)
    return report


def run_and_report(cfg: DictConfig) -> dict:
    """:func:`run`, then where each step's output is. Ctrl-C (SIGINT) stops the run with a line saying how to
    go on, not a traceback: every result written so far is complete (each is written atomically)."""
    try:
        report = run(cfg)
    except KeyboardInterrupt:
        log.warning("interrupted: what is written under %s is kept; run the same command again to resume",
                    cfg.pipeline.output)
        raise SystemExit(INTERRUPTED_EXIT_CODE) from None
    if "counts" in report:
        counts = report["counts"]
        log.info("clip shards: %s (%s clips, %s inputs skipped)", report["output"], counts["clips"],
                 counts["skipped_inputs"])
        log.info("report: %s/report.json", cfg.pipeline.output)
    for step in ("features", "sessions", "representations", "session_shards", "adaptation"):
        if step in report:
            log.info("%s: %s", step, report[step]["output"])
    return report


@hydra.main(config_path=str(config_dir()), config_name="pipeline", version_base="1.3")
def _hydra_main(cfg: DictConfig) -> None:
    """Hydra's options (--cfg job, --help) and hydra.* settings; run_command checked the overrides."""
    exit_on_user_error(run_and_report)(cfg)  # a configuration problem or a wrong path: its message, exit code 2


def main() -> None:
    run_command("pipeline", run_and_report, _hydra_main)


if __name__ == "__main__":
    main()
