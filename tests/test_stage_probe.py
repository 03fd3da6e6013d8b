"""The staged-training probe (``benchmarks.known_answer.stage_probe``): its arms share one seed's base, its plain
base renders one speed whatever is asked, and its reference range is the true clips' (the study itself, minutes a
seed, is run by hand: docs/known-answer.md)."""
from __future__ import annotations

import pytest

from benchmarks.known_answer.motion_probe import LEVEL_SPEEDS
from benchmarks.known_answer.stage_probe import BASE_ROW, Settings, run_seed, table

TINY = Settings(base_steps=12, stage_steps=8, long_factor=2, lora_rank=4, high_rank=8, batch=4, layers=1, heads=2,
                head_dim=8, tokens=2, clips=2, sampling_steps=2, lr=1e-3)


@pytest.fixture(scope="module")
def found() -> dict:
    return run_seed(0, ("A", "B", "G"), TINY)


def test_the_plain_base_renders_one_speed_at_every_level(found: dict) -> None:
    base = found[BASE_ROW]["per_level"]
    assert len(base) == len(LEVEL_SPEEDS) and max(base) == pytest.approx(min(base))
    assert found[BASE_ROW]["range_ratio"] == pytest.approx(0.0, abs=1e-9)


def test_the_true_clips_measure_the_levels_speeds(found: dict) -> None:
    assert found["truth"]["per_level"] == pytest.approx(list(LEVEL_SPEEDS), abs=0.1)


def test_every_arm_is_swept_at_its_step_count(found: dict) -> None:
    assert found["A"]["steps"] == "20" and found["B"]["steps"] == "12+8" and found["G"]["steps"] == "12+8"
    for arm in ("A", "B", "G"):
        assert len(found[arm]["per_level"]) == len(LEVEL_SPEEDS)
    rows = table({0: found}, ("A", "B", "G")).splitlines()
    assert len(rows) == 2 + 4 + 1  # header, rule, the base and three arms, the true clips


def test_the_same_seed_gives_the_same_numbers(found: dict) -> None:
    again = run_seed(0, ("B",), TINY)["B"]
    timeless = lambda row: {k: v for k, v in row.items() if k != "seconds"}
    assert timeless(again) == timeless(found["B"])
