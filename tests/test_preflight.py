"""The recipe pre-flight: counts of a pipeline output under a held-out split, and what each shortfall says."""
from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

from animegamer.config.compose import compose_config
from animegamer.config.validate import ConfigError
from animegamer.data.indexed import key_fraction
from animegamer.data.split_checks import session_problems, split_options, split_suggestion
from animegamer.data.split_counts import split_counts
from animegamer.recipe import check_recipe
from animegamer.utils.io import read_json


def _train(output, *extra):
    return compose_config("train", ["model=tiny", f"data.root={output}", *extra])


def _shot_hashes(output) -> list[float]:
    """The split hash of every shot of a pipeline output, smallest first."""
    return sorted(key_fraction(s) for s in set(read_json(output / "clips" / "shots.json").values()))


def test_counts_follow_the_held_out_split(toy_run):
    output, report = toy_run
    shots = read_json(output / "clips" / "shots.json")
    hashes = {shot: key_fraction(shot) for shot in set(shots.values())}
    for fraction in (0.2, 0.5):
        c = split_counts(output, "clips", fraction)
        held = [key for key, shot in shots.items() if hashes[shot] < fraction]
        assert c.clips == c.captioned == report["counts"]["clips"] == len(shots)  # the toy film is fully captioned
        assert c.held_out_clips == len(held) and c.train_clips == len(shots) - len(held)
        assert c.held_out_shots == sum(h < fraction for h in hashes.values())
        # A session trains when none of its clips is held out, validates when all are.
        sessions = [[key in held for key in s["keys"]] for s in read_json(output / "sessions.json")["sessions"]]
        assert c.train_sessions == sum(not any(s) for s in sessions) > 0
        assert c.held_out_sessions == sum(all(s) for s in sessions)


def test_each_shortfall_is_refused_with_what_to_change(toy_run):
    output, _ = toy_run
    hashes = _shot_hashes(output)
    check_recipe(_train(output, "data.val_fraction=0.2"), _train(output, "phase=b", "data.val_fraction=0.2"))

    with pytest.raises(ConfigError) as error:  # nothing held out: nothing to evaluate
        check_recipe(_train(output), evaluation=_train(output, f"data.val_fraction={hashes[0] / 2}"))
    assert error.value.problems[0] == (f"evaluation: no shot is held out at data.val_fraction={hashes[0] / 2} (the "
                                       f"{len(hashes)} shots hash from {hashes[0]:.3f}): raise data.val_fraction above "
                                       f"{hashes[0]:.3f}")
    # and one value that serves every stage: just above the lowest hash, holding out that shot alone
    assert error.value.problems[1].startswith("for all of the above at once: data.val_fraction="
                                              f"{(int(hashes[0] * 100) + 1) / 100:g} holds out 1 of {len(hashes)} shots")
    with pytest.raises(ConfigError, match=rf"lower data.val_fraction below {hashes[-1]:.3f}"):  # all held out
        check_recipe(_train(output, "data.val_fraction=0.999"))

    counts = split_counts(output, "clips", 0.2)
    too_long = replace(counts, train_sessions=0, turns=counts.longest_train_run + 3)
    [message] = session_problems(too_long)
    assert f"pipeline.sessions.turns={counts.longest_train_run + 3}" in message
    assert f"lower pipeline.sessions.turns to {counts.longest_train_run} or less" in message


def test_phase_a_without_held_out_clips_warns_that_validation_is_skipped(toy_run, caplog):
    output, _ = toy_run
    low = _shot_hashes(output)[0]
    check_recipe(_train(output, f"data.val_fraction={low / 2}"))  # trains, but nothing to validate on
    [warning] = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warning == f"phase a: no held-out clip at data.val_fraction={low / 2}: validation is skipped"
    caplog.clear()
    check_recipe(_train(output, f"data.val_fraction={low / 2}"), run="no_warmup")  # one of several runs checked
    [warning] = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warning == f"no_warmup: phase a: no held-out clip at data.val_fraction={low / 2}: validation is skipped"


def test_a_standalone_evaluation_is_not_told_to_hold_out_more_than_training(toy_run):
    """Its exports were trained already: a larger data.val_fraction than theirs is refused (split_problems)."""
    from animegamer.evaluation.preflight import evaluation_problems

    output, _ = toy_run
    low = _shot_hashes(output)[0]
    [problem] = evaluation_problems(_train(output, f"data.val_fraction={low / 2}"))
    assert "raise data.val_fraction" not in problem
    assert f"evaluate exports trained with data.val_fraction above {low:.3f}" in problem


def test_one_split_is_suggested_that_every_stage_can_use():
    """Each stage's own fix can undo another's (holding out more shots can hold out the one run long
    enough for a session): the suggestion is a fraction that holds out shots and keeps a run of
    ``turns`` training clips, or the best there is."""
    clips = [{"key": f"f/{i}", "film": "f", "clip": i} for i in range(6)]
    shot_hash = {0: 0.3, 1: 0.3, 2: 0.6, 3: 0.6, 4: 0.6, 5: 0.9}  # shots A (clips 0-1), B (2-4), C (5)
    options = split_options(clips, {m["key"]: shot_hash[m["clip"]] for m in clips})
    assert [(o.val_fraction, o.held_out_shots, o.longest_train_run) for o in options] == [(0.31, 1, 4), (0.61, 2, 1)]
    counts = SimpleNamespace(shots={"A": 0.3, "B": 0.6, "C": 0.9})
    assert split_suggestion(counts, options, 3) == ("data.val_fraction=0.31 holds out 1 of 3 shots and leaves a run "
                                                    "of 4 training clips, enough for pipeline.sessions.turns=3")
    assert "the longest, 4, comes with data.val_fraction=0.31 and pipeline.sessions.turns=4" in \
        split_suggestion(counts, options, 5)
    # phase (a) alone: any training clip will do, and nothing is said of sessions
    assert split_suggestion(counts, options, None) == ("data.val_fraction=0.31 holds out 1 of 3 shots and leaves a "
                                                       "run of 4 training clips")
    assert split_suggestion(SimpleNamespace(shots={"A": 0.3}), (), 2) is None  # one shot: nothing to split
    # a hash on the grid itself: the fraction above it still holds that shot out
    on_grid = split_options(clips[:2], {"f/0": 0.29, "f/1": 0.57})
    assert [(o.val_fraction, o.held_out_shots) for o in on_grid] == [(0.3, 1)]


def test_a_warm_up_as_long_as_the_run_is_warned_with_the_rate_it_reaches():
    from animegamer.phases.preflight import schedule_warnings

    phase = compose_config("train", ["experiment=quickstart_a", "phase.max_steps=20", "phase.warmup_steps=500"]).phase
    assert schedule_warnings(phase) == [
        "phase.warmup_steps=500 is not below phase.max_steps=20: the learning rate only rises, to 4% of phase.lr at "
        "the last step; lower phase.warmup_steps for a short run"]
    phase.warmup_steps = 5
    assert schedule_warnings(phase) == []
