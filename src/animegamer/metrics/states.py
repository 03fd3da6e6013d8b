"""ACC-S / MAE-S (Table 1, character state updates): predicted vs ground-truth state values.

States are small integers: ML motion level 1..5, SC social {0, 1}, ET entertainment {0, 1},
ST stamina {-1, +1}. Every (sample, key) entry present in the target is scored:

* ACC-S: fraction of entries predicted exactly right; a missing prediction (the model emitted no
  value, or None) counts as wrong.
* MAE-S: mean |predicted - target| over the entries that have a prediction.
"""
from __future__ import annotations

from typing import Mapping, Sequence

from animegamer.contracts.states import STATE_KEYS


def _number(value, where: str) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: state value {value!r} is not a number") from None


def state_accuracy(
    predicted: Sequence[Mapping],
    target: Sequence[Mapping],
    keys: Sequence[str] = STATE_KEYS,
) -> dict:
    """{"acc_s", "mae_s", "n", "missing", "per_state": {key: {"acc", "mae", "n", "missing"}}}.

    ``acc``/``mae`` are None for a key no target carries (and ``mae`` when nothing was predicted).
    """
    if len(predicted) != len(target):
        raise ValueError(f"{len(predicted)} predictions but {len(target)} targets")
    per_state = {}
    total_n = total_correct = total_missing = total_scored = 0
    total_err = 0.0
    for key in keys:
        n = correct = missing = scored = 0
        err = 0.0
        for i, (pred, true) in enumerate(zip(predicted, target)):
            if true.get(key) is None:
                continue
            n += 1
            t = _number(true[key], f"target {i} {key}")
            if pred.get(key) is None:
                missing += 1
                continue
            p = _number(pred[key], f"prediction {i} {key}")
            correct += int(p == t)
            err += abs(p - t)
            scored += 1
        per_state[key] = {
            "acc": correct / n if n else None,
            "mae": err / scored if scored else None,
            "n": n,
            "missing": missing,
        }
        total_n += n
        total_correct += correct
        total_missing += missing
        total_scored += scored
        total_err += err
    if total_n == 0:
        raise ValueError(f"no target carries any of the state keys {tuple(keys)}")
    return {
        "acc_s": total_correct / total_n,
        "mae_s": total_err / total_scored if total_scored else None,
        "n": total_n,
        "missing": total_missing,
        "per_state": per_state,
    }
