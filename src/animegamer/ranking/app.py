"""What the ranking server does for one ``--out`` folder: the rater's pages and clips, the answers, the
report. Raters see columns only: which run a column shows is resolved here, from the rater's own order,
and no page, clip address or answer reply names a run."""
from __future__ import annotations

import hashlib
import hmac
import logging
import re
import secrets
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Optional, Sequence
from urllib.parse import urlencode

from animegamer.errors import InvalidInputError, UserError
from animegamer.evaluation.judge import state_changes
from animegamer.evaluation.judge_record import DIMENSION_LABELS, DIMENSIONS
from animegamer.pages import POSTER_SUFFIX, ensure_poster, render_page
from animegamer.ranking.runs import COLUMN_LABELS, RANK_SCORES, Run, column_order, common_games
from animegamer.ranking.scores import aggregate, is_complete, ranking_status, report_lines
from animegamer.ranking.store import ANSWERS_FILE, LOCK_FILE, AnswerStore, State, folder_flock
from animegamer.utils.io import read_json, write_bytes_atomic, write_json_atomic

log = logging.getLogger(__name__)

SESSION_FILE = "session.json"
REPORT_FILE = "report.md"
RESULTS_FILE = "rankings.json"
PAGE_TEMPLATE = "ranking.html.j2"
RATER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9 _.@-]{0,63}")
ANSWER_KEYS = frozenset({"rater", "game", "dimension", "column", "rank"})
CONTENT_TYPES = {".mp4": "video/mp4", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".png": "image/png"}
# The page's addresses (relative to it): a turn's clip and its poster, the rater's answers.
CLIP_ROUTE, POSTER_ROUTE, ANSWER_ROUTE, STATE_ROUTE = "clip", "poster", "api/answer", "api/state"
TOKEN_HEADER = "X-Ranking-Token"  # a header a page of another origin cannot send without the server's consent
SECRET_BYTES = 32  # the server's key of the raters' tokens and the folder's column salt
TOKEN_DIGEST = hashlib.sha256
DIMENSION_HELP = {
    "overall": "Which game would you rather play?",
    "instruction_following": "Do the clips and state changes do what each instruction says?",
    "contextual_consistency": "Does each turn continue the earlier ones (places, objects, events)?",
    "character_consistency": "Does the character look the same in every turn?",
    "style_consistency": "Does the drawing style stay the same across the turns?",
    "state_update": "Do the state changes fit what the character does?",
}


def valid_rater(rater: Any) -> bool:
    return isinstance(rater, str) and RATER_NAME.fullmatch(rater) is not None


class RankingApp:
    """Pages, clips, answers and the report for one ``--out`` folder. Each instance draws its own key
    for the raters' tokens: a page served by an earlier start of the server must be reloaded."""

    def __init__(self, runs: Sequence[Run], out: str | Path, games: Optional[Sequence[str]] = None) -> None:
        """``games``: what :func:`common_games` gave for ``runs``, where the caller checked them before
        (the command line does, before it binds its port): the games are then not checked, nor their
        warning logged, twice."""
        self.runs = list(runs)
        self.names = [run.name for run in self.runs]
        self.games = common_games(self.runs) if games is None else list(games)
        self.out = Path(out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.salt = self._session()
        self.store = AnswerStore(self.out / ANSWERS_FILE, len(self.runs))
        self._key = secrets.token_bytes(SECRET_BYTES)
        for run in self.runs:
            self._posters(run)

    def _session(self) -> str:
        """The folder's record of the runs it ranks and its column salt (made on the first start).
        The answers of a folder rank one set of runs: another set would mix rankings of other runs."""
        path = self.out / SESSION_FILE
        with folder_flock(self.out / LOCK_FILE):  # two servers starting at once draw one salt
            if not path.exists():
                salt = secrets.token_hex(SECRET_BYTES)
                runs = [{"name": r.name, "folder": str(r.folder.resolve())} for r in self.runs]
                write_json_atomic(path, {"runs": runs, "rank_scores": list(RANK_SCORES[: len(self.runs)]),
                                         "column_salt": salt})
                return salt
            try:
                record = read_json(path)
                recorded = [r["name"] for r in record["runs"]]
            except (ValueError, KeyError, TypeError) as error:
                raise InvalidInputError(f"{path}: not a ranking session record ({error}); it names the runs "
                                        "ranked in this folder: rank in another --out folder") from error
            if recorded != self.names:
                raise UserError(f"{path}: the answers in {self.out} rank the runs {recorded}, not {self.names}; "
                                "rank these in another --out folder (or give the same --names in the same order)")
            salt = record.get("column_salt")
            if not isinstance(salt, str) or not salt:
                salt = secrets.token_hex(SECRET_BYTES)
                log.warning("%s: no column salt recorded; the raters' column orders are drawn anew (every answer "
                            "is kept: answers name runs, not columns)", path)
                write_json_atomic(path, {**record, "column_salt": salt})
            return salt

    def _posters(self, run: Run) -> None:
        for gid in self.games:
            for turn in run.games[gid].get("turns", []):
                video = run.folder / str(turn.get("video", ""))
                if turn.get("video") and video.is_file():
                    ensure_poster(video)

    # ------------------------------------------------------------------ raters
    def order(self, rater: str, game: str) -> list[str]:
        """The run of each column for this rater and game."""
        return column_order(rater, game, self.names, self.salt)

    def token(self, rater: str) -> str:
        """The rater's token: embedded in the rater's page, asked of every call that reads or writes the
        rater's answers or clips. Only a page of this server's own origin can read it."""
        return hmac.new(self._key, rater.encode("utf-8"), TOKEN_DIGEST).hexdigest()

    def token_matches(self, rater: Any, token: Any) -> bool:
        if not valid_rater(rater) or not isinstance(token, str):
            return False
        return hmac.compare_digest(token.encode("utf-8", "replace"), self.token(rater).encode("ascii"))

    # ------------------------------------------------------------------ answers
    def answer(self, payload: Any) -> dict:
        """Store one choice; returns the dimension's status and the rater's progress. Raises ValueError
        (the page shows its message) for anything that is not a choice on this page."""
        if not isinstance(payload, dict):
            raise ValueError("an answer is a JSON object")
        unknown = sorted(set(payload) - ANSWER_KEYS)
        if unknown:
            raise ValueError(f"unknown fields {unknown}; an answer has {sorted(ANSWER_KEYS)}")
        rater, game, dimension, column = (payload.get(k) for k in ("rater", "game", "dimension", "column"))
        rank = payload.get("rank")
        if not valid_rater(rater):
            raise ValueError(f"rater {rater!r}: 1 to 64 letters, digits, spaces or _.@-")
        if not isinstance(game, str) or game not in self.games:
            raise ValueError(f"unknown game {game!r}")
        if not isinstance(dimension, str) or dimension not in DIMENSIONS:
            raise ValueError(f"unknown dimension {dimension!r}")
        order = self.order(rater, game)
        labels = list(COLUMN_LABELS[: len(order)])
        if not isinstance(column, str) or column not in labels:
            raise ValueError(f"unknown column {column!r}; this game has columns {labels}")
        if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= len(order)):
            raise ValueError(f"rank {rank!r}: an integer from 1 to {len(order)}, or null to clear")
        self.store.append({"time": datetime.now(timezone.utc).isoformat(timespec="milliseconds"), "rater": rater,
                           "game": game, "dimension": dimension, "run": order[labels.index(column)], "rank": rank})
        state = self.write_report()
        status, text = ranking_status(state.get((rater, game, dimension), {}), len(self.names))
        return {"saved": True, "status": status, "status_text": text, "progress_text": self.progress_text(rater, state)}

    def labelled_state(self, rater: str, state: Optional[State] = None) -> dict:
        """The rater's current ranks as the page shows them: game -> dimension -> column -> rank."""
        labelled: dict[str, dict[str, dict[str, int]]] = {}
        for (who, game, dimension), ranks in (self.store.snapshot() if state is None else state).items():
            if who != rater or game not in self.games or not ranks:
                continue
            order = self.order(rater, game)
            labelled.setdefault(game, {})[dimension] = {COLUMN_LABELS[order.index(run)]: rank
                                                        for run, rank in ranks.items() if run in order}
        return labelled

    def progress_text(self, rater: str, state: State) -> str:
        complete = sum(1 for (who, game, _), ranks in state.items()
                       if who == rater and game in self.games and is_complete(ranks, self.names))
        return f"{complete} of {len(self.games) * len(DIMENSIONS)} rankings complete"

    # ------------------------------------------------------------------ report (for whoever runs the server)
    def aggregate(self) -> dict:
        return aggregate(self.store.snapshot(), self.names, self.games)

    def report_files(self) -> dict[str, Path]:
        return {"report_md": self.out / REPORT_FILE, "rankings_json": self.out / RESULTS_FILE}

    def write_report(self) -> State:
        """Rewrite report.md and rankings.json from every answer in the folder (those of other servers on
        it too); returns the answers they were written from."""
        files = self.report_files()
        with self.store.locked() as state:  # the report written last holds every answer
            snapshot = {key: dict(ranks) for key, ranks in state.items()}
            result = aggregate(snapshot, self.names, self.games)
            write_json_atomic(files["rankings_json"], {**result, "answers": str(self.store.path)})
            write_bytes_atomic(files["report_md"], ("\n".join(report_lines(result, self.runs)) + "\n").encode())
        return snapshot

    # ------------------------------------------------------------------ pages and clips
    def _clip_url(self, route: str, rater: str, game: str, column: str, turn: int) -> str:
        return f"{route}?" + urlencode({"rater": rater, "game": game, "column": column, "turn": turn,
                                        "token": self.token(rater)})

    def page(self, rater: Optional[str], index: int, nonce: str) -> str:
        """The page: a name form without a valid ``rater``, else game ``index`` for the rater. ``nonce``
        is the one the response's Content-Security-Policy allows to run its script."""
        if not valid_rater(rater):
            return render_page(PAGE_TEMPLATE, title="AnimeGamer ranking", meta=[], rater=None,
                               invalid_rater=rater is not None, games=len(self.games), nonce=nonce)
        index = max(0, min(index, len(self.games) - 1))
        game = self.games[index]
        order = self.order(rater, game)
        labels = COLUMN_LABELS[: len(order)]
        snapshot = self.store.snapshot()
        state = self.labelled_state(rater, snapshot).get(game, {})
        columns = []
        for label, name in zip(labels, order):
            run = self.runs[self.names.index(name)]
            turns = run.games[game].get("turns", [])
            changes = state_changes([t["states"] for t in turns])
            cells = []
            for number, (turn, change) in enumerate(zip(turns, changes)):
                poster = Path(str(turn.get("video", ""))).with_suffix(POSTER_SUFFIX)
                cells.append({"src": self._clip_url(CLIP_ROUTE, rater, game, label, number),
                              "poster": (self._clip_url(POSTER_ROUTE, rater, game, label, number)
                                         if (run.folder / poster).is_file() else None),
                              "label": "", "states": f"motion {turn['states']['ML']}; {change}"})
            columns.append({"label": label, "cells": cells})
        # The runs agree on every turn they played (common_games): the one that played most names every row.
        reference = max((run.games[game].get("turns", []) for run in self.runs), key=len)
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
                if all(is_complete(snapshot.get((rater, g, d), {}), self.names) for d in DIMENSIONS)}
        nav = [{"number": i + 1, "href": "?" + urlencode({"rater": rater, "game": i}), "current": i == index,
                "done": g in done} for i, g in enumerate(self.games)]
        return render_page(PAGE_TEMPLATE, title="AnimeGamer ranking", meta=[f"rater {rater}"], rater=rater,
                           invalid_rater=False, progress=self.progress_text(rater, snapshot), game=game, index=index,
                           games=len(self.games), token=self.token(rater), nonce=nonce,
                           answer_route=ANSWER_ROUTE, token_header=TOKEN_HEADER,
                           labels=list(labels), turns=turns, dimensions=dimensions,
                           ranks=list(range(1, len(order) + 1)), nav=nav,
                           previous=nav[index - 1]["href"] if index > 0 else None,
                           next=nav[index + 1]["href"] if index + 1 < len(nav) else None)

    def clip_file(self, route: str, rater: str, game: Any, column: Any, turn: Any) -> Optional[Path]:
        """The clip (``CLIP_ROUTE``) or poster (``POSTER_ROUTE``) of ``turn`` (its number from 0, as text)
        in the column ``column`` of the rater's game: the file under the run's folder that the run's
        record names, or None for anything else."""
        if not valid_rater(rater) or game not in self.games:
            return None
        order = self.order(rater, game)
        labels = list(COLUMN_LABELS[: len(order)])
        if column not in labels:
            return None
        run = self.runs[self.names.index(order[labels.index(column)])]
        turns = run.games[game].get("turns", [])
        numbers = [str(number) for number in range(len(turns))]
        if turn not in numbers or not turns[numbers.index(turn)].get("video"):
            return None
        relative = Path(str(turns[numbers.index(turn)]["video"]))
        if route == POSTER_ROUTE:
            relative = relative.with_suffix(POSTER_SUFFIX)
        folder = run.folder.resolve()
        try:
            path = (folder / relative).resolve()
        except (OSError, ValueError):  # a record naming no possible path
            return None
        if not path.is_relative_to(folder) or not path.is_file() or path.suffix.lower() not in CONTENT_TYPES:
            return None
        return path
