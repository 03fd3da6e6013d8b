"""Recipe decisions that need no training: the demonstration game read back while nothing it depends on
changed, the first pipeline call leaving the steps that read exports to the recipe, and the true reason
a stage's validation metric is missing from the summary."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from animegamer import recipe
from animegamer.data.split_counts import SplitCounts

TURNS = 3


@pytest.fixture
def story(monkeypatch):
    """recipe.story_or_reuse with the game replaced by one that writes its files (counting its plays) and
    the fingerprint by the value in ``state["fingerprint"]``."""
    state = {"plays": 0, "fingerprint": "one"}

    def play(composed, out: Path) -> dict:
        state["plays"] += 1
        out.mkdir(parents=True, exist_ok=True)
        turns = [{"video": f"turn_{i:03d}.mp4"} for i in range(TURNS)]
        for turn in turns:
            (out / turn["video"]).write_bytes(b"clip")
        (out / "game.json").write_text(json.dumps({"turns": turns}))
        (out / "index.html").write_text("<html></html>")
        return {"page": str(out / "index.html"), "played": TURNS, "planned": TURNS}

    monkeypatch.setattr(recipe, "play_story", play)
    monkeypatch.setattr(recipe, "evaluation_fingerprint", lambda composed: state["fingerprint"])
    return state


def test_the_demonstration_game_is_played_again_only_when_something_it_depends_on_changed(story, tmp_path):
    out = tmp_path / "game"
    first = recipe.story_or_reuse(None, out)
    assert story["plays"] == 1 and first["played"] == TURNS
    assert recipe.story_or_reuse(None, out) == first and story["plays"] == 1  # the same inputs: read back

    story["fingerprint"] = "two"  # another setting, export or clip manifest
    recipe.story_or_reuse(None, out)
    assert story["plays"] == 2
    (out / "turn_001.mp4").unlink()  # a file of it gone
    recipe.story_or_reuse(None, out)
    assert story["plays"] == 3
    (out / recipe.STORY_RECORD).unlink()  # a game cut short leaves no record
    recipe.story_or_reuse(None, out)
    assert story["plays"] == 4 and recipe.story_or_reuse(None, out) == first and story["plays"] == 4
    (out / recipe.STORY_RECORD).write_text("{not json")  # a damaged record: played again, not a traceback
    recipe.story_or_reuse(None, out)
    assert story["plays"] == 5


class FirstCallDone(Exception):
    pass


def test_the_first_pipeline_call_leaves_the_steps_that_read_exports_to_the_recipe(tmp_path, monkeypatch):
    """Over representations of features since recomputed (a caption edit), the pipeline's default
    session-shard step would warn that they are stale, seconds before the recipe makes them afresh."""
    from animegamer.quickstart import QUICKSTART
    from animegamer.data.lineage import INDEX_FILES

    output = tmp_path / "pipeline"
    (output / INDEX_FILES["representations"]).parent.mkdir(parents=True)
    (output / INDEX_FILES["representations"]).write_text("{}")  # an earlier run's representations
    calls = []

    def first_call(overrides: list[str]) -> dict:
        calls.append(overrides)
        raise FirstCallDone

    monkeypatch.setattr(recipe, "run_pipeline_step", first_call)
    with pytest.raises(FirstCallDone):
        recipe.run_recipe(replace(QUICKSTART, extra=[f"pipeline.output={output}"]))
    [overrides] = calls
    assert "pipeline.steps=[process,finalize,precompute,sessions]" in overrides
    assert recipe.first_pipeline_steps(["experiment=quickstart", f"pipeline.output={output}",
                                        "pipeline.precompute.enabled=false"]) == ["process", "finalize", "sessions"]


def _counts(**changes) -> SplitCounts:
    counts = SplitCounts(folder="clips", val_fraction=0.2, clips=20, captioned=20, shots={"a": 0.1, "b": 0.7},
                         train_clips=16, held_out_clips=4, longest_train_run=8, turns=5, train_sessions=3,
                         held_out_sessions=1)
    return replace(counts, **changes)


def test_a_missing_validation_metric_says_why():
    cfg = recipe.compose_config("train", ["phase=b", "phase.max_steps=300", "phase.val_every_n_steps=100"])
    trained = {"metrics": {"train/loss": 1.0}}
    key = "val/state_accuracy"
    assert recipe.validation_result({"metrics": {key: 0.75}}, key, cfg, _counts(), sessions=True) == 0.75
    assert recipe.validation_result({"metrics": {}}, key, cfg, _counts(), sessions=True) == \
        recipe.NOT_VALIDATED.format(reason=recipe.FINISHED_EARLIER)
    # trained in this launch, but no session is made only of held-out clips: the data is why, not a finished stage
    no_session = recipe.validation_result(trained, key, cfg, _counts(held_out_sessions=0), sessions=True)
    assert no_session == ("not measured in this launch: no session is made only of held-out clips at "
                          "data.val_fraction=0.2 (4 held-out clip(s) in 1 shot(s))")
    assert recipe.validation_result(trained, "val/loss", cfg, _counts(held_out_clips=0)) == \
        "not measured in this launch: no held-out clip at data.val_fraction=0.2"
    rare = recipe.compose_config("train", ["phase=b", "phase.max_steps=30", "phase.val_every_n_steps=100"])
    assert recipe.validation_result(trained, key, rare, _counts(), sessions=True) == \
        "not measured in this launch: phase.val_every_n_steps=100 is above phase.max_steps=30"
