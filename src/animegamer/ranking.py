"""Human ranking of evaluated runs, the paper's Table 2 user study: a local page, its answers, their scores.

    python -m animegamer.ranking --runs outputs/eval_c outputs/eval_a --names adapted plain --out rankings

serves a page on 127.0.0.1 (standard library ``http.server``; no outside network) that shows the same
benchmark game from 2 to 4 ``evaluate.py`` folders side by side (each turn's clip, instruction and
predicted states) and asks the rater to rank the clips in each of the six dimensions of the MLLM judge.
The runs are shown blind, as columns A, B, ... in an order drawn per rater and game. Every choice is
stored the moment it is made: one line appended to ``<out>/answers.jsonl`` and fsynced before the page
is told it is saved, so a crash or a closed tab loses nothing and a reload shows the rater's answers
again. Each complete ranking (every column ranked, no rank twice) scores the runs with the paper's
mapping of ranks 1..4 to 10/7/4/1; ``<out>/report.md`` and ``rankings.json`` give, per dimension and
run, the mean score beside the run's MLLM judge score, with the raters' agreement: Kendall's W per
dimension and, per rater, the mean Spearman correlation with every other rater. They are rewritten
after every answer; ``--report-only`` writes them from the answers without serving.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import re
import statistics
import threading
from dataclasses import dataclass
from datetime import datetime, timezone
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence
from urllib.parse import parse_qs, quote, unquote, urlencode, urlsplit

from animegamer.errors import InvalidInputError, MissingInputError, UserError, exit_on_user_error
from animegamer.metrics.judge import DIMENSION_LABELS, DIMENSIONS, judge_cell, state_changes

log = logging.getLogger("animegamer.ranking")  # the same name under ``python -m animegamer.ranking``

RANK_SCORES = (10, 7, 4, 1)  # the paper: rank 1 (best) .. 4 -> score
MIN_RUNS, MAX_RUNS = 2, len(RANK_SCORES)
COLUMN_LABELS = "ABCD"
HOST = "127.0.0.1"
DEFAULT_PORT = 8765
ANSWERS_FILE = "answers.jsonl"
SESSION_FILE = "session.json"
REPORT_FILE = "report.md"
RESULTS_FILE = "rankings.json"
METRICS_FILE = "metrics.json"  # what evaluate.py writes into each run folder
PAGE_TEMPLATE = "ranking.html.j2"
RATER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9 _.@-]{0,63}")
MAX_BODY_BYTES = 4096  # one answer is a few dozen bytes
SCORE_DECIMALS = 2
CONTENT_TYPES = {".mp4": "video/mp4", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".png": "image/png"}
DIMENSION_HELP = {
    "overall": "Which game would you rather play?",
    "instruction_following": "Do the clips and state changes do what each instruction says?",
    "contextual_consistency": "Does each turn continue the earlier ones (places, objects, events)?",
    "character_consistency": "Does the character look the same in every turn?",
    "style_consistency": "Does the drawing style stay the same across the turns?",
    "state_update": "Do the state changes fit what the character does?",
}
STATUS_COMPLETE, STATUS_INCOMPLETE, STATUS_DUPLICATE = "complete", "incomplete", "duplicate"


# --------------------------------------------------------------------------- runs
@dataclass(frozen=True)
class Run:
    name: str
    folder: Path
    games: dict  # game id -> the report game (metrics.json's "games" entry; clip paths relative to folder)
    judge: Optional[dict]  # metrics.json's judge record, if the run was judged


def load_run(folder: str | Path, name: str) -> Run:
    folder = Path(folder)
    path = folder / METRICS_FILE
    if not path.is_file():
        raise MissingInputError(f"{path}: missing; --runs takes folders written by evaluate.py (evaluation.out)")
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        games = {str(g["id"]): g for g in record["games"]}
    except (ValueError, KeyError, TypeError) as error:
        raise InvalidInputError(f"{path}: not an evaluation record with games ({error})") from error
    if not games:
        raise InvalidInputError(f"{path}: no game was played in this run")
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
    """The games every run played (same benchmark game id), in the first run's order."""
    ids = [gid for gid in runs[0].games if all(gid in run.games for run in runs[1:])]
    if not ids:
        raise InvalidInputError("the runs share no game: evaluate them on the same benchmark "
                                "(evaluation.benchmark=<one run's benchmark.json>)")
    left_out = sorted({gid for run in runs for gid in run.games} - set(ids))
    if left_out:
        log.warning("ranking: %d games not played by every run are left out: %s", len(left_out), ", ".join(left_out))
    return ids


def column_order(rater: str, game: str, runs: Sequence[str]) -> list[str]:
    """The run shown in each column for this rater and game: a fixed draw (sha256 of rater, game and run),
    so the runs are blind to the rater and no run sits in the same column for everyone."""
    key = lambda run: hashlib.sha256(f"{rater}\0{game}\0{run}".encode()).hexdigest()
    return sorted(runs, key=key)


# --------------------------------------------------------------------------- answers
def _valid_answer(record: Any, runs: int) -> bool:
    if not isinstance(record, dict):
        return False
    rank = record.get("rank")
    return (all(isinstance(record.get(k), str) for k in ("rater", "game", "dimension", "run"))
            and (rank is None or (isinstance(rank, int) and not isinstance(rank, bool) and 1 <= rank <= runs)))


class AnswerStore:
    """``answers.jsonl``: one line per choice (rater, game, dimension, run, rank or null to clear it),
    appended and fsynced; the current answers are the latest line for each (rater, game, dimension, run)."""

    def __init__(self, path: Path, runs: int) -> None:
        self.path = path
        self.runs = runs
        self._lock = threading.Lock()
        self.state: dict[tuple[str, str, str], dict[str, int]] = {}
        self.lines = 0
        self._load()

    def _load(self) -> None:
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        complete = data.rfind(b"\n") + 1
        if complete < len(data):
            # A line cut short by a crash was never acknowledged to the page: drop it before appending.
            log.warning("%s: dropping an incomplete last line (%d bytes) left by an interrupted write",
                        self.path, len(data) - complete)
            with open(self.path, "r+b") as f:
                f.truncate(complete)
                os.fsync(f.fileno())
        for number, line in enumerate(data[:complete].decode("utf-8").splitlines(), start=1):
            try:
                record = json.loads(line)
            except ValueError as error:
                raise InvalidInputError(f"{self.path}:{number}: not a JSON answer ({error}); "
                                        "fix or remove that line") from error
            if not _valid_answer(record, self.runs):
                raise InvalidInputError(f"{self.path}:{number}: not an answer for {self.runs} runs: {line[:200]}")
            self._apply(record)
            self.lines += 1

    def _apply(self, record: Mapping) -> None:
        ranks = self.state.setdefault((record["rater"], record["game"], record["dimension"]), {})
        if record["rank"] is None:
            ranks.pop(record["run"], None)
        else:
            ranks[record["run"]] = record["rank"]

    def append(self, record: dict) -> None:
        """Write ``record`` durably, then apply it: when this returns, the answer survives a crash."""
        line = json.dumps(record, sort_keys=True) + "\n"
        with self._lock:
            new = not self.path.exists()
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(line)
                f.flush()
                os.fsync(f.fileno())
            if new:  # the file's name is durable only once its folder is synced
                folder = os.open(self.path.parent, os.O_RDONLY)
                try:
                    os.fsync(folder)
                finally:
                    os.close(folder)
            self._apply(record)
            self.lines += 1

    def ranks(self, rater: str, game: str, dimension: str) -> dict[str, int]:
        with self._lock:
            return dict(self.state.get((rater, game, dimension), {}))

    def snapshot(self) -> dict[tuple[str, str, str], dict[str, int]]:
        with self._lock:
            return {key: dict(ranks) for key, ranks in self.state.items()}


def ranking_status(ranks: Mapping[str, int], runs: int) -> tuple[str, str]:
    """(status, text for the rater) of one dimension's ranks."""
    values = list(ranks.values())
    repeated = sorted({v for v in values if values.count(v) > 1})
    if repeated:
        return STATUS_DUPLICATE, f"rank {repeated[0]} is given twice: give each clip its own rank"
    if len(values) == runs:
        return STATUS_COMPLETE, "saved"
    return STATUS_INCOMPLETE, f"saved; {len(values)} of {runs} ranked"


def is_complete(ranks: Mapping[str, int], runs: Sequence[str]) -> bool:
    return set(ranks) == set(runs) and sorted(ranks.values()) == list(range(1, len(runs) + 1))


# --------------------------------------------------------------------------- aggregation
def spearman(a: Mapping[str, int], b: Mapping[str, int]) -> float:
    """Spearman's rho of two complete rankings of the same items, without ties: 1 - 6 sum d^2 / (n (n^2 - 1))."""
    n = len(a)
    return 1.0 - 6.0 * sum((a[k] - b[k]) ** 2 for k in a) / (n * (n * n - 1))


def kendall_w(rankings: Sequence[Mapping[str, int]]) -> float:
    """Kendall's W of m complete rankings of the same n items, without ties: 12 S / (m^2 (n^3 - n))."""
    m, items = len(rankings), list(rankings[0])
    n = len(items)
    totals = [sum(r[item] for r in rankings) for item in items]
    mean = m * (n + 1) / 2
    return 12.0 * sum((t - mean) ** 2 for t in totals) / (m * m * (n ** 3 - n))


def aggregate(state: Mapping[tuple[str, str, str], Mapping[str, int]], runs: Sequence[str],
              games: Sequence[str]) -> dict:
    """Scores per dimension and run (the mean of 10/7/4/1 over complete rankings), Kendall's W per
    dimension (the mean over games ranked completely by at least two raters), and per rater the mean
    Spearman rho with the other raters over the (game, dimension) pairs both ranked completely."""
    complete = {key: ranks for key, ranks in state.items() if key[1] in games and key[2] in DIMENSIONS
                and is_complete(ranks, runs)}
    raters = sorted({rater for rater, _, _ in complete})
    scores, counts, agreement = {}, {}, {}
    for dimension in DIMENSIONS:
        rows = [ranks for (_, _, d), ranks in complete.items() if d == dimension]
        counts[dimension] = len(rows)
        scores[dimension] = {run: (statistics.mean(RANK_SCORES[r[run] - 1] for r in rows) if rows else None)
                             for run in runs}
        per_game = [[ranks for (_, g, d), ranks in complete.items() if d == dimension and g == game] for game in games]
        ws = [kendall_w(rankings) for rankings in per_game if len(rankings) >= 2]
        agreement[dimension] = {"kendall_w": statistics.mean(ws) if ws else None, "games": len(ws)}
    per_rater = {}
    for rater in raters:
        rhos = [spearman(ranks, complete[(other, game, dimension)])
                for (who, game, dimension), ranks in complete.items() if who == rater
                for other in raters if other != rater and (other, game, dimension) in complete]
        per_rater[rater] = {"rankings": sum(1 for who, _, _ in complete if who == rater),
                            "spearman": statistics.mean(rhos) if rhos else None, "pairs": len(rhos)}
    return {"runs": list(runs), "games": list(games), "rank_scores": list(RANK_SCORES[: len(runs)]),
            "scores": scores, "rankings": counts, "agreement": agreement, "raters": per_rater}


def _number(value: Optional[float], decimals: int = SCORE_DECIMALS) -> str:
    return "-" if value is None else f"{value:.{decimals}f}"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def report_lines(result: Mapping, runs: Sequence[Run]) -> list[str]:
    """report.md: Table 2 with each run's MLLM judge and human scores, then the raters' agreement."""
    names = result["runs"]
    scores_text = "/".join(str(s) for s in result["rank_scores"])
    lines = ["# AnimeGamer human ranking (Table 2)", "",
             f"{len(names)} runs, {len(result['games'])} games, {_count(len(result['raters']), 'rater')}; a complete "
             f"ranking of a game in a dimension gives ranks 1..{len(names)} the scores {scores_text} (the paper's "
             "mapping), and a run's human score is the mean over complete rankings.", ""]
    lines += [f"- `{run.name}`: {run.folder}" for run in runs] + [""]
    header = "| Dimension | " + " | ".join(f"`{n}` judge | `{n}` human" for n in names) + " | Rankings | Kendall's W |"
    lines += ["## Table 2", "", header, "|---" * (2 * len(names) + 3) + "|"]
    for dimension in DIMENSIONS:
        cells = []
        for run in runs:
            judged = run.judge.get("scores", {}).get(dimension) if run.judge else None
            cells.append(judge_cell(run.judge, dimension) if judged else "not judged")
            cells.append(_number(result["scores"][dimension][run.name]))
        agreement = result["agreement"][dimension]
        lines.append(f"| {DIMENSION_LABELS[dimension]} | " + " | ".join(cells)
                     + f" | {result['rankings'][dimension]} | {_number(agreement['kendall_w'], 3)} |")
    models = sorted({f"`{run.judge['model']}`" for run in runs if run.judge and run.judge.get("model")})
    lines += ["", "Judge: the MLLM judge's score from each run's own evaluation (mean ± sd over its samples; "
              f"{', '.join(models) if models else 'no run was judged'}). Human: mean of {scores_text}, higher is "
              "better. Kendall's W: agreement of the raters who ranked the same game completely, averaged over "
              "such games (1 = identical rankings, 0 = none; - = no game ranked by two raters). The repository "
              "does not record the paper's Table 2 numbers (its judge is GPT-4V and its ranking study had 20 "
              "raters and four methods).", "",
              "## Raters", "", "| Rater | Complete rankings | Mean Spearman rho with the others | Pairs |",
              "|---|---|---|---|"]
    lines += [f"| {rater} | {row['rankings']} | {_number(row['spearman'], 3)} | {row['pairs']} |"
              for rater, row in result["raters"].items()]
    lines += ["", "Spearman rho between a rater's ranking and another rater's ranking of the same game in the same "
              "dimension (1 = same order, -1 = reversed), averaged over every such pair: a rater far below the "
              "others ranks differently from them."]
    return lines


# --------------------------------------------------------------------------- the application
class RankingApp:
    """What the server does: pages, clips, answers and the report, for one ``--out`` folder."""

    def __init__(self, runs: Sequence[Run], out: str | Path) -> None:
        self.runs = list(runs)
        self.names = [run.name for run in self.runs]
        self.games = common_games(self.runs)
        self.out = Path(out)
        self.out.mkdir(parents=True, exist_ok=True)
        self._check_session()
        self.store = AnswerStore(self.out / ANSWERS_FILE, len(self.runs))
        self._report_lock = threading.Lock()
        for run in self.runs:
            self._posters(run)

    def _check_session(self) -> None:
        """The answers of a folder rank one set of runs: another set would mix rankings of other runs."""
        from animegamer.utils.io import write_json_atomic

        path = self.out / SESSION_FILE
        if path.exists():
            recorded = json.loads(path.read_text(encoding="utf-8"))["runs"]
            if [r["name"] for r in recorded] != self.names:
                raise UserError(f"{path}: the answers in {self.out} rank the runs "
                                f"{[r['name'] for r in recorded]}, not {self.names}; rank these in another --out "
                                "folder (or give the same --names in the same order)")
            return
        write_json_atomic(path, {"runs": [{"name": r.name, "folder": str(r.folder.resolve())} for r in self.runs],
                                 "rank_scores": list(RANK_SCORES[: len(self.runs)])})

    def _posters(self, run: Run) -> None:
        from animegamer.pages import ensure_poster

        for gid in self.games:
            for turn in run.games[gid].get("turns", []):
                video = run.folder / str(turn.get("video", ""))
                if turn.get("video") and video.is_file():
                    ensure_poster(video)

    # ------------------------------------------------------------------ answers
    def answer(self, payload: Any) -> dict:
        """Store one choice; returns the dimension's status and the rater's progress. Raises ValueError
        (the page shows its message) for anything that is not a choice on this page."""
        if not isinstance(payload, dict):
            raise ValueError("an answer is a JSON object")
        rater, game, dimension, column = (payload.get(k) for k in ("rater", "game", "dimension", "column"))
        rank = payload.get("rank")
        if not isinstance(rater, str) or not RATER_NAME.fullmatch(rater):
            raise ValueError(f"rater {rater!r}: 1 to 64 letters, digits, spaces or _.@-")
        if game not in self.games:
            raise ValueError(f"unknown game {game!r}")
        if dimension not in DIMENSIONS:
            raise ValueError(f"unknown dimension {dimension!r}")
        order = column_order(rater, game, self.names)
        labels = COLUMN_LABELS[: len(order)]
        if column not in labels:
            raise ValueError(f"unknown column {column!r}; this game has columns {list(labels)}")
        if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= len(order)):
            raise ValueError(f"rank {rank!r}: an integer from 1 to {len(order)}, or null to clear")
        run = order[labels.index(column)]
        self.store.append({"time": datetime.now(timezone.utc).isoformat(timespec="milliseconds"), "rater": rater,
                           "game": game, "dimension": dimension, "run": run, "rank": rank})
        self.write_report()
        status, text = ranking_status(self.store.ranks(rater, game, dimension), len(self.names))
        return {"saved": True, "status": status, "status_text": text, "progress_text": self.progress_text(rater)}

    def labelled_state(self, rater: str) -> dict:
        """The rater's current ranks as the page shows them: game -> dimension -> column -> rank."""
        state: dict[str, dict[str, dict[str, int]]] = {}
        for (who, game, dimension), ranks in self.store.snapshot().items():
            if who != rater or game not in self.games or not ranks:
                continue
            order = column_order(rater, game, self.names)
            state.setdefault(game, {})[dimension] = {COLUMN_LABELS[order.index(run)]: rank
                                                     for run, rank in ranks.items() if run in order}
        return state

    def complete_count(self, rater: str) -> int:
        return sum(1 for (who, game, dimension), ranks in self.store.snapshot().items()
                   if who == rater and game in self.games and is_complete(ranks, self.names))

    def progress_text(self, rater: str) -> str:
        return f"{self.complete_count(rater)} of {len(self.games) * len(DIMENSIONS)} rankings complete"

    # ------------------------------------------------------------------ report
    def aggregate(self) -> dict:
        return aggregate(self.store.snapshot(), self.names, self.games)

    def write_report(self) -> dict[str, Path]:
        from animegamer.utils.io import write_bytes_atomic, write_json_atomic

        with self._report_lock:
            result = self.aggregate()
            files = {"report_md": self.out / REPORT_FILE, "rankings_json": self.out / RESULTS_FILE}
            write_json_atomic(files["rankings_json"], {**result, "answers": str(self.out / ANSWERS_FILE)})
            write_bytes_atomic(files["report_md"], ("\n".join(report_lines(result, self.runs)) + "\n").encode())
        return files

    # ------------------------------------------------------------------ pages and files
    def clip_url(self, run_index: int, video: str) -> str:
        return f"clips/{run_index}/{quote(Path(video).as_posix())}"

    def page(self, rater: Optional[str], index: int) -> str:
        from animegamer.pages import POSTER_SUFFIX, render_page

        if rater is None or not RATER_NAME.fullmatch(rater):
            return render_page(PAGE_TEMPLATE, title="AnimeGamer ranking", meta=[], rater=None,
                               invalid_rater=rater is not None, games=len(self.games))
        index = max(0, min(index, len(self.games) - 1))
        game = self.games[index]
        order = column_order(rater, game, self.names)
        labels = COLUMN_LABELS[: len(order)]
        state = self.labelled_state(rater).get(game, {})
        columns = []
        for label, name in zip(labels, order):
            run_index = self.names.index(name)
            turns = self.runs[run_index].games[game].get("turns", [])
            changes = state_changes([t["states"] for t in turns])
            cells = []
            for turn, change in zip(turns, changes):
                video = str(turn.get("video", ""))
                poster = Path(video).with_suffix(POSTER_SUFFIX).as_posix()
                has_poster = (self.runs[run_index].folder / poster).is_file()
                cells.append({"src": self.clip_url(run_index, video),
                              "poster": self.clip_url(run_index, poster) if has_poster else None, "label": "",
                              "states": f"motion {turn['states']['ML']}; {change}"})
            columns.append({"label": label, "cells": cells})
        reference = self.runs[0].games[game].get("turns", [])
        rows = max(len(c["cells"]) for c in columns)
        turns = [{"number": t + 1, "instruction": reference[t]["instruction"] if t < len(reference) else "",
                  "cells": [c["cells"][t] if t < len(c["cells"]) else None for c in columns]} for t in range(rows)]
        dimensions = []
        for dimension in DIMENSIONS:
            ranks = state.get(dimension, {})
            status, text = ranking_status(ranks, len(order)) if ranks else ("", "")
            dimensions.append({"key": dimension, "label": DIMENSION_LABELS[dimension],
                               "help": DIMENSION_HELP[dimension], "ranks": ranks, "status": status,
                               "status_text": text})
        done = {g for g in self.games
                if all(is_complete(self.store.ranks(rater, g, d), self.names) for d in DIMENSIONS)}
        nav = [{"number": i + 1, "href": "?" + urlencode({"rater": rater, "game": i}), "current": i == index,
                "done": g in done} for i, g in enumerate(self.games)]
        return render_page(PAGE_TEMPLATE, title="AnimeGamer ranking", meta=[f"rater {rater}"], rater=rater,
                           invalid_rater=False, progress=self.progress_text(rater), game=game, index=index,
                           games=len(self.games),
                           labels=list(labels), turns=turns, dimensions=dimensions,
                           ranks=list(range(1, len(order) + 1)), nav=nav,
                           previous=nav[index - 1]["href"] if index > 0 else None,
                           next=nav[index + 1]["href"] if index + 1 < len(nav) else None)

    def clip_file(self, run_index: int, relative: str) -> Optional[Path]:
        """The file under run ``run_index``'s folder that ``relative`` names, or None outside it."""
        if not 0 <= run_index < len(self.runs):
            return None
        folder = self.runs[run_index].folder.resolve()
        path = (folder / relative).resolve()
        if not path.is_relative_to(folder) or not path.is_file() or path.suffix.lower() not in CONTENT_TYPES:
            return None
        return path


# --------------------------------------------------------------------------- HTTP
class _Handler(BaseHTTPRequestHandler):
    server: "RankingServer"

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, payload: Any) -> None:
        self._send(status, json.dumps(payload).encode(), "application/json")

    def do_GET(self) -> None:  # noqa: N802 - http.server API
        app = self.server.app
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        if url.path in ("/", "/index.html"):
            try:
                index = int(query.get("game", "0"))
            except ValueError:
                index = 0
            self._send(HTTPStatus.OK, app.page(query.get("rater"), index).encode(), "text/html; charset=utf-8")
        elif url.path == "/api/state":
            self._json(HTTPStatus.OK, {"answers": app.labelled_state(query.get("rater", ""))})
        elif url.path == "/api/summary":
            self._json(HTTPStatus.OK, app.aggregate())
        elif url.path.startswith("/clips/"):
            run, _, relative = url.path[len("/clips/"):].partition("/")
            path = app.clip_file(int(run), unquote(relative)) if run.isdigit() else None
            if path is None:
                self._json(HTTPStatus.NOT_FOUND, {"error": "no such clip"})
            else:
                self._send(HTTPStatus.OK, path.read_bytes(), CONTENT_TYPES[path.suffix.lower()])
        else:
            self._json(HTTPStatus.NOT_FOUND, {"error": f"no page {url.path}"})

    do_HEAD = do_GET

    def do_POST(self) -> None:  # noqa: N802 - http.server API
        if urlsplit(self.path).path != "/api/answer":
            self._json(HTTPStatus.NOT_FOUND, {"error": "answers go to /api/answer"})
            return
        length = int(self.headers.get("Content-Length") or 0)
        if not 0 < length <= MAX_BODY_BYTES:
            self._json(HTTPStatus.BAD_REQUEST, {"error": f"an answer is 1 to {MAX_BODY_BYTES} bytes of JSON"})
            return
        try:
            result = self.server.app.answer(json.loads(self.rfile.read(length)))
        except ValueError as error:  # a bad answer (json's decode errors are ValueErrors too): not stored
            self._json(HTTPStatus.BAD_REQUEST, {"error": str(error)})
            return
        self._json(HTTPStatus.OK, result)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
        log.debug("%s %s", self.address_string(), format % args)


class RankingServer(ThreadingHTTPServer):
    """The app on ``127.0.0.1:port`` (0: a free port); ``url`` is what to open."""

    daemon_threads = True

    def __init__(self, app: RankingApp, port: int = DEFAULT_PORT) -> None:
        super().__init__((HOST, port), _Handler)
        self.app = app

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.server_address[1]}/"


# --------------------------------------------------------------------------- command line
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m animegamer.ranking", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", nargs="+", required=True, help=f"{MIN_RUNS} to {MAX_RUNS} evaluate.py output folders")
    parser.add_argument("--names", nargs="+", help="a name per run for the report (default: the folder names)")
    parser.add_argument("--out", required=True, type=Path, help="folder of the answers and the report")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="port on 127.0.0.1 (0: any free port)")
    parser.add_argument("--report-only", action="store_true", help="write the report from the answers and exit")
    return parser


@exit_on_user_error
def main(argv: Optional[Sequence[str]] = None) -> int:
    from animegamer.utils.logging import setup_logging

    args = build_parser().parse_args(argv)
    setup_logging("INFO")
    app = RankingApp(load_runs(args.runs, args.names), args.out)
    files = app.write_report()
    if args.report_only:
        log.info("ranking: %d answers; report %s", app.store.lines, files["report_md"])
        return 0
    try:
        server = RankingServer(app, args.port)
    except OSError as error:
        raise UserError(f"cannot serve on {HOST}:{args.port} ({error}); pass another --port") from error
    log.info("ranking: open %s?rater=YOUR_NAME in a browser; every answer is saved to %s as it is given; "
             "report %s; Ctrl-C to stop", server.url, app.store.path, files["report_md"])
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        log.info("ranking: stopped; report %s", files["report_md"])
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
