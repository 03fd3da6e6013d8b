"""The storyboard page of a played game: one card per turn, its clip (with a poster frame), instruction
and state bars.

Rendered from game.json's content (``animegamer.game.writer.GameWriter.record``) through the
``storyboard.html.j2`` template into ``index.html`` next to the clips (no scripts, no external assets,
links relative to the page): open it in a browser, wherever the folder is.
"""
from __future__ import annotations

from pathlib import Path

from animegamer.contracts.states import CHARACTER_STATES, ENTERTAINMENT, SOCIAL, STAMINA, STATE_LABELS
from animegamer.pages import clip_entry, write_page
from animegamer.utils.text import count_of

STATE_COLOURS = {SOCIAL: "#e0719e", ENTERTAINMENT: "#f2a93b", STAMINA: "#4caf7a"}
TEMPLATE = "storyboard.html.j2"


def _value(value, low: int = 0, high: int = 100) -> int:
    return max(low, min(high, int(value)))


def state_bars(after: dict, predicted: dict | None = None) -> list[dict]:
    """One bar per character state (0..100), with the predicted delta beside it when known."""
    return [{"key": key, "label": STATE_LABELS[key], "value": _value(after[key]), "colour": STATE_COLOURS[key],
             "delta": int(predicted[key]) if predicted and key in predicted else None}
            for key in CHARACTER_STATES if key in after]


def turn_card(turn: dict, folder: Path) -> dict:
    timings = turn.get("timings") or {}
    return {"index": int(turn["index"]), "instruction": str(turn["instruction"]),
            "clip": clip_entry(folder / str(turn["video"]), folder), "motion_level": int(turn["motion_level"]),
            "flow": float(turn["flow"]), "bars": state_bars(turn["states_after"], turn.get("predicted")),
            "timings": [f"{name} {float(seconds):.2f}s" for name, seconds in timings.items()]}


def page_meta(record: dict) -> list[str]:
    meta = [count_of(len(record.get("turns", [])), "turn"), f"seed {record.get('seed')}"]
    if record.get("window_turns") is not None:
        # The window counts the turn being predicted; the model reads the turns before it in the window.
        earlier = int(record["window_turns"]) - 1
        meta.append(f"each turn reads up to {count_of(earlier, 'earlier turn')}" if earlier
                    else "each turn reads no earlier turn")
    if record.get("turn_limit"):
        meta.append(f"limit {count_of(int(record['turn_limit']), 'turn')}")
    if record.get("seconds_per_turn") is not None:
        meta.append(f"{float(record['seconds_per_turn']):.2f} s/turn")
    if record.get("model"):
        meta.append(f"model {record['model']}")
    if record.get("finished") is False:
        meta.append("not finished: still playing, or stopped (the same command resumes it)")
    return meta


def write_storyboard(path: str | Path, record: dict, title: str = "AnimeGamer game") -> Path:
    """Write the page for a game record (game.json's content) to ``path``; the record's clip names are
    relative to the page's folder."""
    path = Path(path)
    initial = record.get("initial_states") or {}
    return write_page(path, TEMPLATE, title=title, meta=page_meta(record), error=record.get("error"),
                      start=state_bars(initial), turns=[turn_card(t, path.parent) for t in record.get("turns", [])])
