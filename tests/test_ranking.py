"""The human ranking page (Table 2's user study): answers stored as they are given, kept across a
restart or a reload, aggregated with 10/7/4/1 into the report exactly as by hand; its HTTP API without
a browser, and a scripted rater in headless Chromium (skipped without a Chromium on PATH)."""
from __future__ import annotations

import json
import re
import socket
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, Iterator, Optional
from urllib.parse import parse_qs, urlencode, urlsplit

import numpy as np
import pytest

from animegamer.evaluation.judge import DIMENSIONS
from animegamer.ranking import RankingApp, RankingServer, kendall_w, load_runs, spearman
from animegamer.ranking.cli import main
from animegamer.ranking.app import REPORT_FILE, RESULTS_FILE, TOKEN_HEADER
from animegamer.ranking.server import MAX_BODY_BYTES, REQUEST_TIMEOUT_S
from animegamer.ranking.store import ANSWERS_FILE
from cdp_browser import Browser, find_browser
from http_fakes import LocalServer
from page_helpers import PageReader

RUNS = ("alpha", "beta", "gamma")
GAMES = ("g1", "g2")
OTHERS = DIMENSIONS[1:]  # every dimension but "overall"
FRAMES, HEIGHT, WIDTH = 9, 48, 96


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    yield


def _judge_record() -> dict:
    from animegamer.config.schema import JudgeConfig
    from animegamer.evaluation.judge import game_summary, summarize

    samples = [{"scores": dict(zip(DIMENSIONS, values)), "attempts": 1, "error": ""}
               for values in ((6, 5, 5, 8, 9, 3), (8, 5, 7, 8, 9, 5))]
    return summarize(JudgeConfig(url="http://127.0.0.1:1/v1", model_name="fake-vlm", samples=2),
                     [game_summary("g1", samples)])


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> list[Path]:
    """Three evaluation folders (metrics.json and real clips) of the same two games; the first one was
    judged and played one more game."""
    from animegamer.config.schema import ClipsConfig
    from animegamer.media.video import encode_mp4

    root = tmp_path_factory.mktemp("runs")
    folders = []
    for number, name in enumerate(RUNS):
        folder = root / name / "eval"
        games = []
        for gid in GAMES + (("only_alpha",) if name == "alpha" else ()):
            turns = []
            for t in range(2):
                video = Path("games") / gid / f"turn_{t:03d}.mp4"
                (folder / video).parent.mkdir(parents=True, exist_ok=True)
                colour = np.array([60 + 60 * number, 200 - 40 * t, 90], dtype=np.uint8)
                (folder / video).write_bytes(encode_mp4(np.broadcast_to(colour, (FRAMES, HEIGHT, WIDTH, 3)).copy(),
                                                        8, ClipsConfig()))
                turns.append({"instruction": f"Character: Qiqi; Motion: walk {t}; Background: noon town.",
                              "video": video.as_posix(), "states": {"ML": 2 + t, "SC": 1, "ET": 0, "ST": -1}})
            games.append({"id": gid, "turns": turns, "completed": 2, "planned": 2})
        metrics = {"judge": _judge_record()} if name == "alpha" else {}
        (folder / "metrics.json").write_text(json.dumps({"metrics": metrics, "games": games}))
        folders.append(folder)
    return folders


class Serving:
    """A ranking server on a free port of 127.0.0.1, in a thread; requests made as the rater's page makes
    them (the token read from the rater's page), or byte for byte."""

    def __init__(self, folders: list[Path], out: Path, timeout_s: float = REQUEST_TIMEOUT_S) -> None:
        self.app = RankingApp(load_runs(folders, list(RUNS)), out)
        self.server = RankingServer(self.app, port=0, timeout_s=timeout_s)
        self.url = self.server.url
        self.host = f"127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._tokens: dict[str, str] = {}

    def __enter__(self) -> "Serving":
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()

    def get(self, path: str, headers: Optional[dict] = None) -> tuple[int, bytes]:
        request = urllib.request.Request(self.url + path, headers=headers or {})
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as error:
            return error.code, error.read()

    def token(self, rater: str) -> str:
        """The token the rater's page carries."""
        if rater not in self._tokens:
            page = self.get("?" + urlencode({"rater": rater}))[1].decode()
            self._tokens[rater] = re.search(r'data-token="([0-9a-f]+)"', page).group(1)
        return self._tokens[rater]

    def post(self, payload: Any, token: Optional[str] = None, headers: Optional[dict] = None) -> tuple[int, dict]:
        """POST ``payload`` to api/answer as the page does (with the token of the payload's rater unless given)."""
        if token is None:
            token = self.token(payload["rater"]) if isinstance(payload, dict) else ""
        request = urllib.request.Request(self.url + "api/answer", data=json.dumps(payload).encode(), method="POST",
                                         headers={"Content-Type": "application/json", TOKEN_HEADER: token,
                                                  **(headers or {})})
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())

    def state(self, rater: str) -> dict:
        status, body = self.get("api/state?" + urlencode({"rater": rater}), {TOKEN_HEADER: self.token(rater)})
        assert status == 200, body
        return json.loads(body)["answers"]

    def labels(self, rater: str, game: str) -> dict[str, str]:
        """Run -> the column the rater sees it in."""
        order = self.app.order(rater, game)
        return {run: "ABC"[order.index(run)] for run in RUNS}

    def rank(self, rater: str, game: str, dimension: str, ranks: dict[str, int | None]) -> list[dict]:
        """Give ``ranks`` (run name -> rank) as the page would: one answer per column, by label."""
        labels = self.labels(rater, game)
        results = []
        for run, rank in ranks.items():
            status, result = self.post({"rater": rater, "game": game, "dimension": dimension,
                                        "column": labels[run], "rank": rank})
            assert status == 200, result
            results.append(result)
        return results

    def raw(self, data: bytes, timeout_s: float = 10.0) -> tuple[Optional[int], bytes]:
        """Send ``data`` as it is; (status, body) of the reply, (None, b"") when the connection ends without one."""
        with socket.create_connection(("127.0.0.1", self.server.server_address[1]), timeout=timeout_s) as connection:
            connection.sendall(data)
            reply = b""
            try:
                while chunk := connection.recv(1 << 16):
                    reply += chunk
            except ConnectionResetError:
                pass
        if not reply:
            return None, b""
        head, _, body = reply.partition(b"\r\n\r\n")
        return int(head.split(b" ", 2)[1]), body

    def request(self, method: str, path: str, body: bytes = b"", **headers: str) -> tuple[Optional[int], bytes]:
        """One request byte for byte: ``Host`` this server's unless given; header names with _ for -, None
        leaves the header out."""
        fields = {"Host": self.host, **{name.replace("_", "-"): value for name, value in headers.items()}}
        fields = {name: value for name, value in fields.items() if value is not None}
        head = f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in fields.items()) + "\r\n"
        return self.raw(head.encode("latin-1") + body)


def ranking(*order: str) -> dict[str, int]:
    """Runs from best to worst -> their ranks."""
    return {run: rank for rank, run in enumerate(order, start=1)}


# --------------------------------------------------------------------------- the statistics
def test_kendall_w_and_spearman_by_hand():
    a, b = ranking("alpha", "beta", "gamma"), ranking("alpha", "gamma", "beta")
    assert spearman(a, a) == 1.0 and spearman(a, ranking("gamma", "beta", "alpha")) == -1.0
    assert spearman(a, b) == 0.5  # d = 0, 1, 1: 1 - 6 * 2 / (3 * 8)
    assert kendall_w([a, a, a]) == 1.0
    assert kendall_w([a, b]) == 0.75  # rank sums 2, 5, 5 around 4: S = 6, W = 12 * 6 / (4 * 24)
    assert kendall_w([ranking("alpha", "beta"), ranking("beta", "alpha")]) == 0.0


# --------------------------------------------------------------------------- the HTTP API, no browser
def test_answers_survive_a_restart_and_aggregate_to_the_hand_computation(runs, tmp_path):
    out = tmp_path / "rankings"
    with Serving(runs, out) as serving:
        for dimension in DIMENSIONS:
            serving.rank("alice", "g1", dimension, ranking("alpha", "beta", "gamma"))
        # Midway through g2: alpha first, then beta given the same rank, then alpha's rank cleared.
        assert serving.rank("alice", "g2", "overall", {"alpha": 1})[-1]["status_text"] == "saved; 1 of 3 ranked"
        duplicate = serving.rank("alice", "g2", "overall", {"beta": 1})[-1]
        assert duplicate["status"] == "duplicate" and "rank 1 is given twice" in duplicate["status_text"]
        assert serving.rank("alice", "g2", "overall", {"alpha": None})[-1]["status_text"] == "saved; 1 of 3 ranked"
        state_before = serving.state("alice")
        lines_before = (out / ANSWERS_FILE).read_text().splitlines()
    assert len(lines_before) == 6 * 3 + 3  # every choice is a line, written before the reply

    # A new server on the same folder (the first one "crashed") has every answer.
    with Serving(runs, out) as serving:
        assert serving.state("alice") == state_before
        assert state_before["g2"] == {"overall": {serving.labels("alice", "g2")["beta"]: 1}}
        assert len(state_before["g1"]) == 6
        page = serving.get("?rater=alice&game=1")[1].decode()
        assert page.count(" selected>1</option>") == 1 and "saved; 1 of 3 ranked" in page
        assert "1 of 12 rankings complete" not in page and "6 of 12 rankings complete" in page

        last = serving.rank("alice", "g2", "overall", {"alpha": 2, "gamma": 3})[-1]
        assert last["status"] == "complete" and last["progress_text"] == "7 of 12 rankings complete"
        for dimension in OTHERS:
            serving.rank("alice", "g2", dimension, ranking("gamma", "beta", "alpha"))
        serving.rank("bob", "g1", "overall", ranking("alpha", "gamma", "beta"))
        for dimension in OTHERS:
            serving.rank("bob", "g1", dimension, ranking("alpha", "beta", "gamma"))
        serving.rank("bob", "g2", "overall", ranking("alpha", "beta", "gamma"))
        serving.rank("bob", "g2", "style_consistency", {"alpha": 1})  # incomplete: not counted
    summary = json.loads((out / RESULTS_FILE).read_text())  # the scores: in the folder, not on the page

    # By hand. Overall: alpha 10, 7, 10, 10; beta 7, 10, 4, 7; gamma 4, 4, 7, 4 (alice g1, g2, bob g1, g2).
    assert summary["scores"]["overall"] == {"alpha": 9.25, "beta": 7.0, "gamma": 4.75}
    assert summary["rankings"]["overall"] == 4
    # Other dimensions: alice g1 (alpha, beta, gamma), alice g2 (gamma, beta, alpha), bob g1 (alpha, beta, gamma).
    for dimension in OTHERS:
        assert summary["scores"][dimension] == {"alpha": 8.0, "beta": 7.0, "gamma": 6.0}
        assert summary["rankings"][dimension] == 3
        assert summary["agreement"][dimension] == {"kendall_w": 1.0, "games": 1}  # g1: identical rankings
    assert summary["agreement"]["overall"] == {"kendall_w": 0.75, "games": 2}  # 0.75 on g1 and on g2
    # alice and bob share 7 complete rankings: rho 1 on g1's five other dimensions, 0.5 on both overalls.
    assert summary["raters"]["alice"] == {"rankings": 12, "spearman": pytest.approx(6 / 7), "pairs": 7}
    assert summary["raters"]["bob"] == {"rankings": 7, "spearman": pytest.approx(6 / 7), "pairs": 7}
    assert summary["games"] == list(GAMES)  # only_alpha was not played by every run

    report = (out / REPORT_FILE).read_text().splitlines()
    start = report.index("## Table 2")
    assert report[start + 2:start + 10] == [
        "| Dimension | `alpha` judge | `alpha` human | `beta` judge | `beta` human | `gamma` judge | `gamma` human "
        "| Rankings | Kendall's W |",
        "|---|---|---|---|---|---|---|---|---|",
        "| Overall | 7.00 ± 1.41 | 9.25 | not judged | 7.00 | not judged | 4.75 | 4 | 0.750 |",
        "| Instruction following | 5.00 ± 0.00 | 8.00 | not judged | 7.00 | not judged | 6.00 | 3 | 1.000 |",
        "| Contextual consistency | 6.00 ± 1.41 | 8.00 | not judged | 7.00 | not judged | 6.00 | 3 | 1.000 |",
        "| Character consistency | 8.00 ± 0.00 | 8.00 | not judged | 7.00 | not judged | 6.00 | 3 | 1.000 |",
        "| Style consistency | 9.00 ± 0.00 | 8.00 | not judged | 7.00 | not judged | 6.00 | 3 | 1.000 |",
        "| State update | 4.00 ± 1.41 | 8.00 | not judged | 7.00 | not judged | 6.00 | 3 | 1.000 |",
    ]
    assert "| alice | 12 | 0.857 | 7 |" in report and "| bob | 7 | 0.857 | 7 |" in report
    assert json.loads((out / RESULTS_FILE).read_text())["scores"]["overall"]["gamma"] == 4.75


def test_bad_answers_are_refused_and_not_stored(runs, tmp_path):
    out = tmp_path / "rankings"
    good = {"rater": "alice", "game": "g1", "dimension": "overall", "column": "A", "rank": 1}
    with Serving(runs, out) as serving:
        for change, message in [({"rank": 4}, "rank 4: an integer from 1 to 3"), ({"rank": True}, "rank True"),
                                ({"rank": "1"}, "rank '1'"), ({"column": "D"}, "unknown column 'D'"),
                                ({"game": "only_alpha"}, "unknown game"), ({"dimension": "fun"}, "unknown dimension"),
                                ({"column": ["A"]}, "unknown column ['A']"), ({"game": {"g1": 1}}, "unknown game"),
                                ({"dimension": None}, "unknown dimension"),
                                ({"run": "alpha"}, "unknown fields ['run']")]:
            status, result = serving.post({**good, **change})
            assert status == 400 and message in result["error"], (change, result)
        for rater in ("<script>", "", ["alice"]):  # no name a page is served for: no token matches it
            status, result = serving.post({**good, "rater": rater}, token=serving.token("alice"))
            assert status == 403 and "no valid token" in result["error"], (rater, result)
        assert serving.post([1, 2], token=serving.token("alice")) == (400, {"error": "an answer is a JSON object"})
        assert not (out / ANSWERS_FILE).exists()
        # Clips are served from inside the run folders only.
        # A clip is a (rater, game, column, turn) of the page; anything else is none.
        clip = {"rater": "alice", "game": "g1", "column": "A", "turn": "0", "token": serving.token("alice")}
        assert serving.get("clip?" + urlencode(clip))[0] == 200
        assert serving.get("poster?" + urlencode(clip))[0] == 200  # the poster made at start
        for change in ({"column": "D"}, {"turn": "2"}, {"turn": "-1"}, {"turn": "01"}, {"game": "only_alpha"},
                       {"turn": "../metrics.json"}):
            assert serving.get("clip?" + urlencode({**clip, **change}))[0] == 404, change
        assert b'name="rater"' in serving.get("")[1]  # no name yet: the page asks for one


# --------------------------------------------------------------------------- what the server refuses
GOOD = {"rater": "alice", "game": "g1", "dimension": "overall", "column": "A", "rank": 1}


def test_requests_of_another_origin_host_or_content_type_are_refused_and_not_counted(runs, tmp_path):
    out = tmp_path / "rankings"
    with Serving(runs, out) as serving:
        body = json.dumps(GOOD).encode()
        token = serving.token("alice")
        port = serving.server.server_address[1]
        answer = dict(Content_Type="application/json", Content_Length=str(len(body)), X_Ranking_Token=token)
        for headers, status in [
            ({"Origin": f"http://127.0.0.1:{port + 1}"}, 403),  # a page of another local origin
            ({"Origin": f"http://localhost:{port}"}, 403),  # another origin, though the same server
            ({"Origin": "null"}, 403),  # a sandboxed frame or a file
            ({"Host": f"rebound.example:{port}"}, 403),  # a name of another site that resolves to 127.0.0.1
            ({"Host": f"127.0.0.1:{port + 1}"}, 403),
            ({"Content_Type": "text/plain"}, 415),  # what a page of another origin may send without asking
            ({"Content_Type": "application/x-www-form-urlencoded"}, 415),
            ({"Content_Type": "application/json; charset=latin-1"}, 415),
        ]:
            reply = serving.request("POST", "/api/answer", body, **{**answer, **headers})
            assert reply[0] == status, (headers, reply)
        # A foreign Host reads nothing either: not the page (and its token), not the rater's answers.
        for path in ("/?rater=alice", "/api/state?rater=alice", "/api/summary"):
            assert serving.request("GET", path, X_Ranking_Token=token, Host=f"rebound.example:{port}")[0] == 403
        assert not (out / ANSWERS_FILE).exists() and serving.app.aggregate()["rankings"]["overall"] == 0
        # The same answer from the page's own origin, by either name of this machine, is stored.
        assert serving.request("POST", "/api/answer", body, **answer, Origin=f"http://{serving.host}")[0] == 200
        assert serving.request("POST", "/api/answer", body, **answer, Host=f"localhost:{port}",
                               Origin=f"http://localhost:{port}")[0] == 200
        assert len((out / ANSWERS_FILE).read_text().splitlines()) == 2


def test_a_missing_or_wrong_token_is_refused(runs, tmp_path):
    out = tmp_path / "rankings"
    with Serving(runs, out) as earlier:
        earlier_token = earlier.token("alice")
    with Serving(runs, out) as serving:
        token = serving.token("alice")
        assert token == serving.app.token("alice") and token != earlier_token  # drawn anew at each start
        for wrong in ("", "0" * len(token), token[:-1], serving.token("bob"), earlier_token, token.upper()):
            status, result = serving.post(GOOD, token=wrong)
            assert status == 403 and "no valid token" in result["error"], wrong
            assert serving.get("api/state?rater=alice", {TOKEN_HEADER: wrong})[0] == 403
            clip = {"rater": "alice", "game": "g1", "column": "A", "turn": "0", "token": wrong}
            assert serving.get("clip?" + urlencode(clip))[0] == 403
        assert serving.get("api/state?rater=alice")[0] == 403  # no token at all
        assert serving.request("POST", "/api/answer", json.dumps(GOOD).encode(), Content_Type="application/json",
                               Content_Length=str(len(json.dumps(GOOD))))[0] == 403
        assert not (out / ANSWERS_FILE).exists()
        assert serving.post(GOOD, token=token)[0] == 200
        assert serving.state("alice") == {"g1": {"overall": {"A": 1}}}


def _clips(page: str) -> list[tuple[str, dict[str, str]]]:
    """(route, query fields) of every clip and poster of a page."""
    reader = PageReader()
    reader.feed(page)
    links = [urlsplit(url) for tag, _, url in reader.links if tag == "video"]
    return [(link.path, {k: v[-1] for k, v in parse_qs(link.query).items()}) for link in links]


def test_clips_are_asked_for_by_column_and_each_rater_gets_the_runs_of_their_own_order(runs, tmp_path):
    raters = [f"rater{n}" for n in range(8)]
    files = {(run, game, turn): (folder / "games" / game / f"turn_{turn:03d}.mp4").read_bytes()
             for run, folder in zip(RUNS, runs) for game in GAMES for turn in range(2)}
    with Serving(runs, tmp_path / "rankings") as serving:
        shown = {}  # (rater, game) -> the run of each column, as the clips served show it
        for rater in raters:
            for index, game in enumerate(GAMES):
                page = serving.get("?" + urlencode({"rater": rater, "game": index}))[1].decode()
                assert not any(name in page for name in RUNS) and not any(str(folder) in page for folder in runs)
                clips = _clips(page)
                assert len(clips) == 2 * 3 * 2  # a clip and a poster for each turn of each column
                columns: dict[str, str] = {}
                for route, fields in clips:
                    assert route in ("clip", "poster") and set(fields) == {"rater", "game", "column", "turn", "token"}
                    assert (fields["rater"], fields["game"]) == (rater, game)
                    if route == "clip":
                        status, data = serving.get(f"{route}?" + urlencode(fields))
                        assert status == 200
                        [run] = [r for r in RUNS if files[(r, game, int(fields["turn"]))] == data]
                        assert columns.setdefault(fields["column"], run) == run
                shown[(rater, game)] = [columns[label] for label in "ABC"]
                assert shown[(rater, game)] == serving.app.order(rater, game)  # resolved by the server
        # Each rater's own draw: eight raters all seeing one order in both games has odds of 6 ** -14.
        assert len({tuple(tuple(shown[(rater, game)]) for game in GAMES) for rater in raters}) > 1


def test_the_scores_are_not_served_to_raters(runs, tmp_path):
    out = tmp_path / "rankings"
    with Serving(runs, out) as serving:
        serving.rank("alice", "g1", "overall", ranking("alpha", "beta", "gamma"))
        token = serving.token("alice")
        for path in ("api/summary", f"api/summary?rater=alice&token={token}"):
            assert serving.get(path, {TOKEN_HEADER: token})[0] == 404
        page = serving.get("?rater=alice")[1].decode()
        assert not any(name in page for name in RUNS) and "Kendall" not in page
    assert json.loads((out / RESULTS_FILE).read_text())["scores"]["overall"] == {"alpha": 10, "beta": 7, "gamma": 4}


def test_malformed_requests_get_400_and_the_server_keeps_serving(runs, tmp_path):
    out = tmp_path / "rankings"
    with Serving(runs, out) as serving:
        token = serving.token("alice")

        def post(body: bytes, **headers: str) -> tuple[Optional[int], bytes]:
            fields = {"Content_Type": "application/json", "Content_Length": str(len(body)), "X_Ranking_Token": token}
            return serving.request("POST", "/api/answer", body, **{**fields, **headers})

        deep = b"[" * 2000 + b"]" * 2000
        assert len(deep) <= MAX_BODY_BYTES
        column_list = json.dumps({**GOOD, "column": ["A"]}).encode()
        for name, (status, body) in {
            "Content-Length abc": post(b"{}", Content_Length="abc"),
            "Content-Length -1": post(b"{}", Content_Length="-1"),
            "two Content-Lengths": serving.raw(f"POST /api/answer HTTP/1.1\r\nHost: {serving.host}\r\nContent-Type: "
                                               "application/json\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}"
                                               .encode()),
            "chunked": post(b"2\r\n{}\r\n0\r\n\r\n", Transfer_Encoding="chunked"),
            "JSON nested 2000 deep": post(deep),
            "a list for the column": post(column_list),
            "a list for the answer": post(b"[1, 2]"),
            "not UTF-8": post(b'{"rater": "\xff"}'),
            "not JSON": post(b"{rater: alice}"),
            "%00 in the path": serving.request("GET", "/clips/0/games%00.mp4"),
            "%00 in a field": serving.request("GET", "/clip?rater=alice%00&token=" + token),
            "%ff in the path": serving.request("GET", "/%ff"),
            "%ff in a field": serving.request("GET", "/?rater=%ff"),
            "a byte 0xff in the path": serving.raw(f"GET /\xff HTTP/1.1\r\nHost: {serving.host}\r\n\r\n"
                                                   .encode("latin-1")),
            "two Hosts": serving.raw(f"GET / HTTP/1.1\r\nHost: {serving.host}\r\nHost: {serving.host}\r\n\r\n"
                                     .encode()),
        }.items():
            assert status == 400 and json.loads(body)["error"], (name, status, body)
            assert serving.get("?rater=alice")[0] == 200, name  # still serving
        assert post(b"{}", Content_Length=str(MAX_BODY_BYTES + 1))[0] == 413  # refused before it is read
        assert post(b" " * (MAX_BODY_BYTES + 1))[0] == 413
        assert post(b"{}", Content_Length=None)[0] == 411
        assert serving.get("?rater=alice&game=99999999999999999999999")[0] == 200  # the last game
        assert not (out / ANSWERS_FILE).exists()
        assert post(json.dumps(GOOD).encode())[0] == 200


def test_a_request_without_its_promised_body_times_out(runs, tmp_path):
    timeout_s = 0.5
    with Serving(runs, tmp_path / "rankings", timeout_s=timeout_s) as serving:
        head = (f"POST /api/answer HTTP/1.1\r\nHost: {serving.host}\r\nContent-Type: application/json\r\n"
                f"Content-Length: 60\r\n{TOKEN_HEADER}: {serving.token('alice')}\r\n\r\n{{").encode()
        started = time.monotonic()
        status, body = serving.raw(head, timeout_s=10 * timeout_s)
        waited = time.monotonic() - started
        assert status == 408 and f"within {timeout_s:g} s" in json.loads(body)["error"]
        assert timeout_s * 0.9 <= waited <= timeout_s + 2.0
        started = time.monotonic()
        assert serving.raw(b"GET / HTTP/1.1\r\n", timeout_s=10 * timeout_s) == (None, b"")  # headers never end
        assert time.monotonic() - started <= timeout_s + 2.0
        assert serving.get("?rater=alice")[0] == 200


def test_two_servers_on_one_folder_keep_every_answer(runs, tmp_path):
    out = tmp_path / "rankings"
    with Serving(runs, out) as first, Serving(runs, out) as second:
        assert first.app.order("alice", "g1") == second.app.order("alice", "g1")  # one salt for the folder
        first.rank("alice", "g1", "overall", ranking("alpha", "beta", "gamma"))
        second.rank("bob", "g1", "overall", ranking("gamma", "beta", "alpha"))
        first.rank("alice", "g2", "overall", ranking("beta", "alpha", "gamma"))
        assert first.state("bob") == second.state("bob") == {"g1": {"overall": {
            label: rank for run, label in first.labels("bob", "g1").items()
            for rank in [ranking("gamma", "beta", "alpha")[run]]}}}
        # Every line of both, and the report written last counts both raters.
        assert len((out / ANSWERS_FILE).read_text().splitlines()) == 9
        result = json.loads((out / RESULTS_FILE).read_text())
        assert result["rankings"]["overall"] == 3 and sorted(result["raters"]) == ["alice", "bob"]
        # alpha: 10 (alice g1), 1 ... 4 (bob g1), 7 (alice g2)
        assert result["scores"]["overall"] == {"alpha": 7.0, "beta": 8.0, "gamma": 6.0}
        # A line torn by a server killed mid-write is dropped before the other appends after it.
        with open(out / ANSWERS_FILE, "ab") as answers:
            answers.write(b'{"rater": "carol", "ga')
        second.rank("bob", "g2", "overall", {"alpha": 1})
        lines = (out / ANSWERS_FILE).read_text().splitlines()
        assert len(lines) == 10 and all(json.loads(line)["rater"] in ("alice", "bob") for line in lines)


def test_a_torn_last_line_is_dropped_and_a_damaged_one_is_named(runs, tmp_path):
    from animegamer.errors import InvalidInputError

    out = tmp_path / "rankings"
    with Serving(runs, out) as serving:
        serving.rank("alice", "g1", "overall", ranking("alpha", "beta", "gamma"))
    answers = out / ANSWERS_FILE
    answers.write_bytes(answers.read_bytes() + b'{"rater": "alice", "ga')  # killed mid-write
    app = RankingApp(load_runs(runs, list(RUNS)), out)
    assert app.aggregate()["scores"]["overall"] == {"alpha": 10, "beta": 7, "gamma": 4}
    assert answers.read_bytes().endswith(b"}\n") and len(answers.read_text().splitlines()) == 3
    answers.write_text("not json\n" + answers.read_text())
    with pytest.raises(InvalidInputError, match=f"{answers}:1: not a JSON answer"):
        RankingApp(load_runs(runs, list(RUNS)), out)


def test_a_folder_ranks_one_set_of_runs_and_the_report_can_be_written_alone(runs, tmp_path, capsys):
    from animegamer.errors import UserError

    out = tmp_path / "rankings"
    RankingApp(load_runs(runs, list(RUNS)), out)
    with pytest.raises(UserError, match="rank the runs \\['alpha', 'beta', 'gamma'\\], not \\['alpha', 'beta'\\]"):
        RankingApp(load_runs(runs[:2], list(RUNS[:2])), out)
    with pytest.raises(UserError, match="not distinct"):
        load_runs(runs[:2], ["same", "same"])
    with pytest.raises(SystemExit) as exit_info:
        main(["--runs", str(runs[0]), "--out", str(tmp_path / "one")])
    assert exit_info.value.code == 2 and "2 to 4 evaluation folders" in capsys.readouterr().err
    assert main(["--runs", *map(str, runs), "--names", *RUNS, "--out", str(out), "--report-only"]) == 0
    assert "0 raters" in (out / REPORT_FILE).read_text()


# --------------------------------------------------------------------------- a scripted rater in Chromium
CHROMIUM = find_browser()


def _choose(browser: Browser, dimension: str, label: str, rank: int) -> None:
    browser.evaluate(f"""(() => {{
        const select = document.querySelector('select[data-dimension="{dimension}"][data-column="{label}"]');
        select.value = "{rank}";
        select.dispatchEvent(new Event("change", {{bubbles: true}}));
        return true;
    }})()""")


def _shown(browser: Browser) -> dict[str, dict[str, int]]:
    """The ranks the page shows: dimension -> column label -> rank."""
    return browser.evaluate("""(() => {
        const shown = {};
        document.querySelectorAll("select").forEach(s => {
            if (s.value) {
                (shown[s.dataset.dimension] = shown[s.dataset.dimension] || {})[s.dataset.column] = Number(s.value);
            }
        });
        return shown;
    })()""")


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium on PATH (Debian: apt-get install chromium)")
def test_a_scripted_rater_in_chromium_ranks_two_games_through_a_reload(runs, tmp_path):
    out = tmp_path / "rankings"
    wanted = {"g1": ranking("alpha", "beta", "gamma"), "g2": ranking("gamma", "alpha", "beta")}
    with Serving(runs, out) as serving, Browser(CHROMIUM) as browser:
        labels = {game: serving.labels("carol", game) for game in GAMES}
        browser.navigate(serving.url + "?rater=carol&game=0")
        assert browser.evaluate("document.getElementById('ranking').dataset.game") == "g1"
        assert browser.evaluate("document.querySelectorAll('video').length") == 3 * 2  # 3 runs x 2 turns
        for dimension in DIMENSIONS:
            for run, rank in wanted["g1"].items():
                _choose(browser, dimension, labels["g1"][run], rank)
        browser.wait_for("document.getElementById('ranking').dataset.pending === '0'")
        statuses = browser.evaluate("[...document.querySelectorAll('.status')].map(s => s.dataset.status)")
        assert statuses == ["complete"] * 6
        assert browser.evaluate("document.getElementById('progress').textContent") == "6 of 12 rankings complete"

        browser.click_and_wait("a.next")
        assert browser.evaluate("document.getElementById('ranking').dataset.game") == "g2"
        half = DIMENSIONS[:3]
        for dimension in half:
            for run, rank in wanted["g2"].items():
                _choose(browser, dimension, labels["g2"][run], rank)
        _choose(browser, DIMENSIONS[3], labels["g2"]["gamma"], 1)  # one choice of the fourth dimension
        browser.wait_for("document.getElementById('ranking').dataset.pending === '0'")

        browser.reload()  # midway: nothing is lost
        expected = {d: {labels["g2"][run]: rank for run, rank in wanted["g2"].items()} for d in half}
        expected[DIMENSIONS[3]] = {labels["g2"]["gamma"]: 1}
        assert _shown(browser) == expected
        assert browser.evaluate("document.getElementById('progress').textContent") == "9 of 12 rankings complete"
        for dimension in DIMENSIONS[3:]:
            for run, rank in wanted["g2"].items():
                _choose(browser, dimension, labels["g2"][run], rank)
        browser.wait_for("document.getElementById('ranking').dataset.pending === '0'")
        assert browser.evaluate("document.getElementById('progress').textContent") == "12 of 12 rankings complete"
        browser.navigate(serving.url + "?rater=carol&game=0")  # the first game shows its answers too
        assert _shown(browser) == {d: {labels["g1"][run]: rank for run, rank in wanted["g1"].items()}
                                   for d in DIMENSIONS}

    # By hand: alpha 10 (g1) and 7 (g2), beta 7 and 4, gamma 4 and 10, in every dimension.
    result = json.loads((out / RESULTS_FILE).read_text())
    assert result["scores"] == {d: {"alpha": 8.5, "beta": 5.5, "gamma": 7.0} for d in DIMENSIONS}
    assert result["rankings"] == {d: 2 for d in DIMENSIONS} and result["raters"]["carol"]["rankings"] == 12
    assert "| Overall | 7.00 ± 1.41 | 8.50 | not judged | 5.50 | not judged | 7.00 | 2 | - |" in \
        (out / REPORT_FILE).read_text()


def _blank_page(handler: BaseHTTPRequestHandler) -> None:
    body = b"<!DOCTYPE html><title>another origin</title>"
    handler.send_response(200)
    handler.send_header("Content-Type", "text/html")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


def other_origin() -> LocalServer:
    """A blank page on another port of 127.0.0.1: another local origin, as any other local server is."""
    return LocalServer(_blank_page, methods=("GET",))


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium on PATH (Debian: apt-get install chromium)")
def test_a_page_of_another_local_origin_in_chromium_stores_nothing_and_reads_no_token(runs, tmp_path):
    out = tmp_path / "rankings"
    with Serving(runs, out) as serving, other_origin() as other, Browser(CHROMIUM) as browser:
        browser.navigate(other.base_url + "/")
        answer = json.dumps(json.dumps(GOOD))
        outcomes = browser.evaluate(f"""(async () => {{
            const target = {json.dumps(serving.url)};
            const tries = [
                // a simple request: sent without asking, its reply unreadable
                fetch(target + "api/answer", {{method: "POST", mode: "no-cors", body: {answer},
                                               headers: {{"Content-Type": "text/plain"}}}}),
                // JSON with the token header: the browser asks first, and the server does not consent
                fetch(target + "api/answer", {{method: "POST", body: {answer},
                                               headers: {{"Content-Type": "application/json",
                                                          {json.dumps(TOKEN_HEADER)}: "x"}}}}),
                fetch(target + "?rater=alice").then(response => response.text()),  // the page and its token
            ];
            return (await Promise.allSettled(tries)).map(outcome => outcome.status);
        }})()""")
        assert outcomes == ["fulfilled", "rejected", "rejected"]  # the first's reply is opaque
        assert not (out / ANSWERS_FILE).exists()
        assert serving.app.aggregate()["rankings"]["overall"] == 0


def test_the_same_folder_twice_is_refused(runs, tmp_path):
    """Two names for one folder (or two spellings of its path): refused before anything is served."""
    from animegamer.errors import UserError

    other_spelling = Path(runs[0]).parent / "." / Path(runs[0]).name
    with pytest.raises(UserError, match="same evaluation folder more than once"):
        load_runs([runs[0], other_spelling], ["first", "second"])
