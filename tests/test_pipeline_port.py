"""The recipes reach the data pipeline only through animegamer.pipeline_port and the installed entry point."""
from __future__ import annotations

import pytest

from animegamer import recipe
from animegamer.config.compose import compose_config
from animegamer.errors import UserError
from animegamer.pipeline_port import ENTRY_POINT_GROUP, load_pipeline


def test_the_installed_entry_point_is_the_pipelines_plugin():
    from data_pipeline.plugin import PIPELINE

    pipeline = load_pipeline()
    assert pipeline is PIPELINE
    cfg = compose_config("pipeline", ["pipeline.steps=[process,finalize]"])
    assert pipeline.steps(cfg) == ["process", "finalize"]


def test_a_pipeline_not_installed_is_a_user_error_naming_the_entry_point():
    with pytest.raises(UserError, match=f"{ENTRY_POINT_GROUP}:absent"):
        load_pipeline("absent")


class FakePipeline:
    def __init__(self):
        self.calls = []

    def check(self, cfg, problems=()):
        self.calls.append(("check", list(problems)))

    def steps(self, cfg):
        self.calls.append(("steps", list(cfg.pipeline.steps)))
        return ["process", "sessions", "session_shards", "finalize"]

    def run(self, overrides):
        self.calls.append(("run", list(overrides)))
        return {"output": "out"}


def test_the_recipe_asks_the_port_for_the_steps_and_the_runs(monkeypatch):
    fake = FakePipeline()
    monkeypatch.setattr(recipe, "load_pipeline", lambda: fake)
    steps = recipe.first_pipeline_steps(["pipeline.steps=[process,finalize]"])
    assert steps == [s for s in ["process", "sessions", "session_shards", "finalize"] if s not in recipe.LATER_STEPS]
    assert recipe.run_pipeline_step(["pipeline.output=x"]) == {"output": "out"}
    assert fake.calls == [("steps", ["process", "finalize"]), ("run", ["pipeline.output=x"])]
