"""The data pipeline as the library's recipes reach it (:class:`animegamer.pipeline_port.Pipeline`),
installed as entry point ``animegamer.pipeline`` ``default``."""
from __future__ import annotations

from typing import Sequence

from omegaconf import OmegaConf

from animegamer.config.compose import compose_config
from data_pipeline.__main__ import run as run_pipeline
from data_pipeline.config_checks import validate_pipeline_run
from data_pipeline.ingest import find_inputs
from data_pipeline.run import running_steps


class DataPipeline:
    """:class:`~animegamer.pipeline_port.Pipeline` over this package's own functions."""

    def check(self, cfg, problems: Sequence[str] = ()) -> None:
        validate_pipeline_run(cfg, problems)

    def steps(self, cfg) -> list[str]:
        return running_steps(OmegaConf.to_object(cfg).pipeline)

    def run(self, overrides: list[str]) -> dict:
        return run_pipeline(compose_config("pipeline", overrides))

    def inputs(self, cfg) -> list:
        return find_inputs(cfg.pipeline.inputs, cfg.pipeline.ingest.extensions)


PIPELINE = DataPipeline()
