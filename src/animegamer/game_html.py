"""The storyboard page of a played game: one card per turn, its clip, instruction and state bars.

Rendered from game.json's content (``animegamer.game.GameWriter.record``) into a self-contained
``index.html`` next to the clips (no scripts, no external assets): open it in a browser.
"""
from __future__ import annotations

from html import escape
from pathlib import Path

STATE_ORDER = ("SC", "ET", "ST")
STATE_LABELS = {"SC": "Social", "ET": "Entertainment", "ST": "Stamina"}
STATE_COLOURS = {"SC": "#e0719e", "ET": "#f2a93b", "ST": "#4caf7a"}

STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5rem; background: #16171d; color: #e8e8ee; }
h1 { font-size: 1.4rem; margin: 0 0 .3rem; }
.meta { color: #9a9cab; font-size: .85rem; margin-bottom: 1.2rem; }
.error { background: #5a1f24; color: #ffd6d9; padding: .6rem .8rem; border-radius: 6px; margin-bottom: 1rem; }
.board { display: grid; grid-template-columns: repeat(auto-fill, minmax(320px, 1fr)); gap: 1rem; }
.card { background: #22232c; border-radius: 8px; padding: .8rem; }
.card video { width: 100%; border-radius: 4px; background: #000; }
.turn { font-weight: 600; font-size: .9rem; color: #b7b9ff; }
.instruction { margin: .4rem 0 .6rem; font-size: .92rem; line-height: 1.3; }
.motion { font-size: .8rem; color: #9a9cab; margin-bottom: .5rem; }
.state { display: grid; grid-template-columns: 7.5rem 1fr 4.5rem; align-items: center; gap: .4rem;
         font-size: .8rem; margin: .2rem 0; }
.bar { background: #3a3b47; border-radius: 3px; height: .7rem; overflow: hidden; }
.fill { height: 100%; }
.delta { text-align: right; font-variant-numeric: tabular-nums; }
.timings { font-size: .72rem; color: #7d7f8e; margin-top: .5rem; }
"""


def _value(value, low: int = 0, high: int = 100) -> int:
    return max(low, min(high, int(value)))


def state_bars(after: dict, predicted: dict | None = None) -> str:
    """One CSS-width bar per character state (0..100), with the predicted delta beside it."""
    rows = []
    for key in STATE_ORDER:
        if key not in after:
            continue
        value = _value(after[key])
        delta = "" if not predicted or key not in predicted else f" ({int(predicted[key]):+d})"
        rows.append(
            f'<div class="state state-{key}"><span>{escape(STATE_LABELS[key])} ({key})</span>'
            f'<div class="bar"><div class="fill" style="width: {value}%; background: {STATE_COLOURS[key]}">'
            f'</div></div><span class="delta">{value}{escape(delta)}</span></div>')
    return "\n".join(rows)


def turn_card(turn: dict) -> str:
    video = escape(str(turn["video"]), quote=True)
    timings = turn.get("timings") or {}
    timing_text = ", ".join(f"{escape(str(k))} {float(v):.2f}s" for k, v in timings.items())
    return f"""<div class="card" id="turn-{int(turn['index'])}">
<div class="turn">Turn {int(turn['index']) + 1}</div>
<video src="{video}" controls loop muted playsinline></video>
<div class="instruction">{escape(str(turn['instruction']))}</div>
<div class="motion">motion level {int(turn['motion_level'])} (flow {float(turn['flow']):.3f})</div>
{state_bars(turn['states_after'], turn.get('predicted'))}
<div class="timings">{timing_text}</div>
</div>"""


def render_storyboard(record: dict, title: str = "AnimeGamer game") -> str:
    """The full page for a game record (game.json's content)."""
    turns = record.get("turns", [])
    initial = record.get("initial_states") or {}
    meta = [f"{len(turns)} turns", f"seed {record.get('seed')}", f"window {record.get('max_turns')} turns"]
    if record.get("seconds_per_turn") is not None:
        meta.append(f"{float(record['seconds_per_turn']):.2f} s/turn")
    if record.get("model"):
        meta.append(f"model {record['model']}")
    error = f'<div class="error">Game stopped: {escape(str(record["error"]))}</div>' if record.get("error") else ""
    start = (f'<div class="card" id="start"><div class="turn">Start</div>\n{state_bars(initial)}</div>'
             if initial else "")
    cards = "\n".join(turn_card(t) for t in turns)
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{escape(title)}</title>
<style>{STYLE}</style>
</head>
<body>
<h1>{escape(title)}</h1>
<div class="meta">{escape(" · ".join(meta))}</div>
{error}
<div class="board">
{start}
{cards}
</div>
</body>
</html>
"""


def write_storyboard(path: str | Path, record: dict, title: str = "AnimeGamer game") -> Path:
    from animegamer.utils.io import write_bytes_atomic

    path = Path(path)
    write_bytes_atomic(path, render_storyboard(record, title).encode("utf-8"))
    return path
