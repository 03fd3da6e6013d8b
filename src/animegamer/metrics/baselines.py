"""Baselines scored beside the trained game, with the same metrics, on the same benchmark turns.

* majority-class states: every turn predicted as the most frequent value of each state (ML, SC, ET,
  ST) in the training split's clips; when no training clip is at hand, in the benchmark's own turns
  (then the baseline has seen the answers' distribution, so it is an optimistic floor).
* copy-the-last-turn states: each turn predicted as the previous turn's ground-truth states; a
  game's first turn has no previous turn, so it is scored as a missing prediction (wrong for ACC-S,
  left out of MAE-S), which keeps the baseline on exactly the model's turns.
* shuffled representation (reconstruction): clip i decoded from clip j's representation for a fixed
  seeded derangement, which shows whether the decoder uses its conditioning at all.
* untrained game (``evaluation.untrained_game``, played in ``animegamer.evaluation``): the benchmark
  played with the MLLM as phase (b) started and the trained renderer, scored like the game.
"""
from __future__ import annotations

from collections import Counter
from typing import Mapping, Sequence

import numpy as np

from animegamer.contracts.states import STATE_KEYS
from animegamer.metrics.common import available, unavailable
from animegamer.metrics.states import state_accuracy

MAJORITY = "majority"
COPY_LAST = "copy_last"
SHUFFLED = "shuffled"
UNTRAINED = "untrained"
SOURCE_TRAINING = "training split"
SOURCE_BENCHMARK = "benchmark turns (no training clip at hand)"
# A derangement is drawn by rejection: each draw succeeds with probability about 1/e, so this many
# failures in a row (probability below 1e-40) means a broken generator, not bad luck.
MAX_DERANGEMENT_DRAWS = 256


def majority_states(states: Sequence[Mapping], keys: Sequence[str] = STATE_KEYS) -> dict:
    """Per key, the most frequent value among ``states`` (ties: the smallest value, so the baseline
    does not depend on the order clips were read in); keys no entry carries are left out."""
    prediction = {}
    for key in keys:
        counts = Counter(s[key] for s in states if s.get(key) is not None)
        if counts:
            top = max(counts.values())
            prediction[key] = min(value for value, count in counts.items() if count == top)
    return prediction


def copy_last_predictions(games: Sequence[Sequence[Mapping]]) -> list[dict]:
    """Per turn (games flattened in order), the previous turn's ground-truth states; {} for a game's
    first turn (no prediction)."""
    predictions = []
    for game in games:
        predictions.append({})
        predictions += [dict(previous["states"]) for previous in game[:-1]]
    return predictions


def _scored(predictions: list[dict], targets: list[dict], label: str, **extra) -> dict:
    states = state_accuracy(predictions, targets)
    mae = states["mae_s"]
    return {"label": label, "acc_s": available(states["acc_s"]),
            "mae_s": available(mae) if mae is not None else unavailable("no turn has a prediction"),
            "states": states, **extra}


def state_baselines(games: Sequence[Sequence[Mapping]], training_states: Sequence[Mapping] | None) -> dict:
    """The majority-class and copy-the-last-turn baselines of ``games`` (each a list of benchmark turns
    with ``"states"``, the turns the model was scored on). ``training_states``: the training split's
    states (None or empty: the majority comes from the benchmark's turns, and says so)."""
    targets = [turn["states"] for game in games for turn in game]
    if not targets:
        return {}
    source = SOURCE_TRAINING if training_states else SOURCE_BENCHMARK
    majority = majority_states(training_states if training_states else targets)
    return {
        MAJORITY: _scored([dict(majority) for _ in targets], targets, f"majority class ({source})",
                          source=source, prediction=majority),
        COPY_LAST: _scored(copy_last_predictions(games), targets, "copy the last turn's states"),
    }


def derangement(n: int, seed: int) -> list[int]:
    """A permutation of range(n) with no fixed point, the same for the same (n, seed)."""
    if n < 2:
        raise ValueError(f"a derangement needs at least 2 items, got {n}")
    rng = np.random.default_rng(seed)
    for _ in range(MAX_DERANGEMENT_DRAWS):
        order = rng.permutation(n)
        if not np.any(order == np.arange(n)):
            return [int(j) for j in order]
    raise RuntimeError(f"no derangement of {n} items in {MAX_DERANGEMENT_DRAWS} draws (seed {seed})")
