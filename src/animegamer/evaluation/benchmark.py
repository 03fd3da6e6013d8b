"""The benchmark an evaluation plays: its games' shape, and the game ids and clip keys that become folder and
file names under ``evaluation.out`` (``games/<id>``, ``truth/<key>.mp4``), checked before anything is written.

A benchmark is a JSON object whose ``games`` are ``{"id", "turns": [{"key" (optional), "instruction",
"environment", "level", "states"}]}``: read from ``evaluation.benchmark``, or cut from the held-out clips
(:func:`animegamer.evaluation.runner.held_out_games`). The evaluation's pre-flight reports every problem of
the file; the runner refuses a benchmark with any.
"""
from __future__ import annotations

import json
from pathlib import Path

from animegamer.errors import InvalidInputError

ERROR_EXCERPT_CHARS = 200  # how much of a JSON reader's error a problem quotes
# Characters that would make a name more than one path component (NUL ends a path in the OS).
PATH_SEPARATORS = ("/", "\\", "\0")


def plain_name_problem(name) -> str | None:
    """Why ``name`` cannot be used as one file or folder name inside a folder (None: it can): it must be a
    non-empty string without a path separator, and not ``.`` or ``..``, so that joined to the folder it
    never leaves it."""
    if not isinstance(name, str) or not name.strip():
        return f"{name!r} is not a non-empty string"
    if name in (".", "..") or any(separator in name for separator in PATH_SEPARATORS):
        return f"{name!r} is not a plain name (no '/', '\\', NUL, '.' or '..'): it would name a path outside its folder"
    return None


def benchmark_problems(benchmark, source: str) -> list[str]:
    """What keeps ``benchmark`` (read from ``source``: a file, or the clip shards) from being played
    into its folders: its shape, and each game id and turn key, which become the names of
    ``games/<id>`` and ``truth/<key>.mp4`` under ``evaluation.out``."""
    games = benchmark.get("games") if isinstance(benchmark, dict) else None
    if not isinstance(games, list):
        return [f"{source}: not a benchmark (a JSON object whose \"games\" is a list of games)"]
    problems = []
    for number, game in enumerate(games, start=1):
        if not isinstance(game, dict) or not isinstance(game.get("turns"), list):
            problems.append(f"{source}: game {number} is not an object with \"id\" and a \"turns\" list")
            continue
        if (why := plain_name_problem(game.get("id"))) is not None:
            problems.append(f"{source}: game {number} id {why}")
        for turn_number, turn in enumerate(game["turns"], start=1):
            key = turn.get("key") if isinstance(turn, dict) else None
            if key is not None and (why := plain_name_problem(key)) is not None:
                problems.append(f"{source}: game {number} turn {turn_number} key {why}")
    return problems


def _load_benchmark(path: str | Path) -> tuple[object, list[str]]:
    """The content of the benchmark file ``path`` and what keeps it from being played."""
    try:
        benchmark = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None, [f"evaluation.benchmark={str(path)!r}: {path} does not exist"]
    except (OSError, ValueError, RecursionError) as error:  # ValueError: bad UTF-8 or JSON
        return None, [f"evaluation.benchmark={str(path)!r}: not a readable JSON file ({type(error).__name__}: "
                      f"{str(error)[:ERROR_EXCERPT_CHARS]})"]
    return benchmark, benchmark_problems(benchmark, str(path))


def benchmark_file_problems(path: str | Path) -> list[str]:
    """Every problem of the benchmark file ``path`` (the evaluation's pre-flight reports them)."""
    return _load_benchmark(path)[1]


def read_benchmark(path: str | Path) -> dict:
    """The benchmark file ``path``, refused with every problem at once unless it can be played safely."""
    benchmark, problems = _load_benchmark(path)
    refuse(problems)
    return benchmark


def refuse(problems: list[str]) -> None:
    if problems:
        raise InvalidInputError("\n".join(problems))
