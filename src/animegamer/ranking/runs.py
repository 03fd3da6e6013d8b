"""The evaluated runs a ranking compares (each ``evaluate.py`` folder's games) and the blind column
order in which a rater sees them."""
from __future__ import annotations

import hashlib
import logging
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from animegamer.contracts.files import METRICS_FILE  # what evaluate.py writes into each run folder
from animegamer.errors import InvalidInputError, UserError
from animegamer.evaluation.report import read_evaluation

log = logging.getLogger(__name__)

RANK_SCORES = (10, 7, 4, 1)  # the paper: rank 1 (best) .. 4 -> score
MIN_RUNS, MAX_RUNS = 2, len(RANK_SCORES)
COLUMN_LABELS = string.ascii_uppercase[:MAX_RUNS]
MAX_NAMED_GAMES = 5  # a refusal names this many differing games; the rest are counted
# What --runs takes, as users make it (evaluate.py at the repository's root runs the same command).
RUNS_HINT = "folders written by animegamer eval or evaluate.py (their evaluation.out)"


@dataclass(frozen=True)
class Run:
    name: str
    folder: Path
    games: dict  # game id -> the report game (metrics.json's "games" entry; clip paths relative to folder)
    judge: Optional[dict]  # metrics.json's judge record, if the run was judged


def load_run(folder: str | Path, name: str) -> Run:
    folder = Path(folder)
    record = read_evaluation(folder, f"--runs takes {RUNS_HINT}")
    try:
        games = {str(g["id"]): g for g in record["games"]}
    except KeyError as error:
        raise InvalidInputError(f"{folder / METRICS_FILE}: a game without an id ({error})") from error
    if not games:
        raise InvalidInputError(f"{folder / METRICS_FILE}: no game was played in this run")
    return Run(name, folder, games, (record.get("metrics") or {}).get("judge"))


def load_runs(folders: Sequence[str | Path], names: Optional[Sequence[str]] = None) -> list[Run]:
    if not MIN_RUNS <= len(folders) <= MAX_RUNS:
        raise UserError(f"--runs takes {MIN_RUNS} to {MAX_RUNS} evaluation folders, got {len(folders)}")
    names = list(names) if names else [Path(f).resolve().name for f in folders]
    if len(names) != len(folders):
        raise UserError(f"--names gives {len(names)} names for {len(folders)} runs")
    if len(set(names)) != len(names):
        raise UserError(f"run names {names} are not distinct: name each run with --names")
    resolved = [Path(f).resolve() for f in folders]
    twice = sorted({str(f) for f in resolved if resolved.count(f) > 1})
    if twice:
        raise UserError(f"--runs names the same evaluation folder more than once ({', '.join(twice)}): a run "
                        "ranked against itself tells nothing")
    return [load_run(folder, name) for folder, name in zip(folders, names)]


def common_games(runs: Sequence[Run]) -> list[str]:
    """The games every run played (same benchmark game id), in the first run's order. A game missing
    from some run is left out with a warning; a game id whose turns differ between runs (another
    benchmark's game under the same id) is refused: see :func:`game_mismatch`."""
    ids = [gid for gid in runs[0].games if all(gid in run.games for run in runs[1:])]
    if not ids:
        raise InvalidInputError("the runs share no game: evaluate them on the same benchmark "
                                "(evaluation.benchmark=<one run's benchmark.json>)")
    left_out = sorted({gid for run in runs for gid in run.games} - set(ids))
    if left_out:
        log.warning("ranking: %d games not played by every run are left out: %s", len(left_out), ", ".join(left_out))
    differing = [problem for gid in ids if (problem := game_mismatch(runs, gid))]
    if differing:
        shown = "; ".join(differing[:MAX_NAMED_GAMES])
        more = f"; and {len(differing) - MAX_NAMED_GAMES} more" if len(differing) > MAX_NAMED_GAMES else ""
        raise InvalidInputError(f"{len(differing)} game id(s) name different games in these runs, so raters would "
                                f"compare games that are not the same: {shown}{more}. Evaluate every run on the same "
                                "benchmark (evaluation.benchmark=<one run's benchmark.json>)")
    return ids


def _quoted(text: object, limit: int = 100) -> str:
    shown = repr(text)
    return shown if len(shown) <= limit else shown[: limit - 4] + "...'"


def _planned(game: dict) -> int:
    """The benchmark turns of a game: ``planned``, or, in a record without it, the turns it holds."""
    planned = game.get("planned")
    return planned if isinstance(planned, int) and not isinstance(planned, bool) else len(game.get("turns") or [])


def game_mismatch(runs: Sequence[Run], gid: str) -> str:
    """Why game ``gid`` is not one game in all ``runs`` ("" when it is): its benchmark turns differ in
    number, or a turn that two runs played has different instructions. A run that stopped the game early
    (fewer turns played than planned) still plays the same game: its column shows fewer clips, which the
    raters see and rank."""
    def where(run: Run) -> str:
        return f"{run.name} ({run.folder / METRICS_FILE})"

    games = [run.games[gid] for run in runs]
    planned = [_planned(game) for game in games]
    if len(set(planned)) > 1:
        counts = ", ".join(f"{where(run)} {count} turns" for run, count in zip(runs, planned))
        return f"game {gid}: {counts}"
    turns = [game.get("turns") or [] for game in games]
    for number in range(max(len(t) for t in turns)):
        said = [(run, t[number].get("instruction") if isinstance(t[number], dict) else None)
                for run, t in zip(runs, turns) if number < len(t)]
        if len({instruction for _, instruction in said}) > 1:
            texts = ", ".join(f"{where(run)} {_quoted(instruction)}" for run, instruction in said)
            return f"game {gid}: turn {number + 1} has different instructions: {texts}"
    return ""


def column_order(rater: str, game: str, runs: Sequence[str], salt: str) -> list[str]:
    """The run shown in each column for this rater and game: a fixed draw (sha256 of the ranking
    folder's secret ``salt``, the rater, the game and the run), so no run sits in the same column for
    everyone, the order stays the same across restarts, and a rater who knows the run names cannot
    work it out without the salt, which only the server reads."""
    key = lambda run: hashlib.sha256(f"{salt}\0{rater}\0{game}\0{run}".encode()).hexdigest()
    return sorted(runs, key=key)
