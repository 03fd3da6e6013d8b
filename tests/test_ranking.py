"""The human ranking page (Table 2's user study): answers stored as they are given, kept across a
restart or a reload, aggregated with 10/7/4/1 into the report exactly as by hand; its HTTP API without
a browser, and a scripted rater in headless Chromium (skipped without a Chromium on PATH)."""
from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

from animegamer.metrics.judge import DIMENSIONS
from animegamer.ranking import (ANSWERS_FILE, REPORT_FILE, RESULTS_FILE, RankingApp, RankingServer, column_order,
                                kendall_w, load_runs, main, spearman)
from cdp_browser import Browser, find_browser

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
    from animegamer.metrics.judge import game_summary, summarize

    samples = [{"scores": dict(zip(DIMENSIONS, values)), "attempts": 1, "error": ""}
               for values in ((6, 5, 5, 8, 9, 3), (8, 5, 7, 8, 9, 5))]
    return summarize(JudgeConfig(url="http://127.0.0.1:1/v1", model_name="fake-vlm", samples=2),
                     [game_summary("g1", samples)])


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> list[Path]:
    """Three evaluation folders (metrics.json and real clips) of the same two games; the first one was
    judged and played one more game."""
    from animegamer.config.schema import ClipsConfig
    from data_pipeline.clips import encode_mp4

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
    """A ranking server on a free port of 127.0.0.1, in a thread."""

    def __init__(self, folders: list[Path], out: Path) -> None:
        self.app = RankingApp(load_runs(folders, list(RUNS)), out)
        self.server = RankingServer(self.app, port=0)
        self.url = self.server.url
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def __enter__(self) -> "Serving":
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()

    def get(self, path: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=10) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as error:
            return error.code, error.read()

    def post(self, payload: Any) -> tuple[int, dict]:
        request = urllib.request.Request(self.url + "api/answer", data=json.dumps(payload).encode(),
                                         headers={"Content-Type": "application/json"}, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())

    def rank(self, rater: str, game: str, dimension: str, ranks: dict[str, int | None]) -> list[dict]:
        """Give ``ranks`` (run name -> rank) as the page would: one answer per column, by label."""
        order = column_order(rater, game, list(RUNS))
        results = []
        for run, rank in ranks.items():
            status, result = self.post({"rater": rater, "game": game, "dimension": dimension,
                                        "column": "ABC"[order.index(run)], "rank": rank})
            assert status == 200, result
            results.append(result)
        return results


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
        state_before = json.loads(serving.get("api/state?rater=alice")[1])["answers"]
        lines_before = (out / ANSWERS_FILE).read_text().splitlines()
    assert len(lines_before) == 6 * 3 + 3  # every choice is a line, written before the reply

    # A new server on the same folder (the first one "crashed") has every answer.
    with Serving(runs, out) as serving:
        assert json.loads(serving.get("api/state?rater=alice")[1])["answers"] == state_before
        order = column_order("alice", "g2", list(RUNS))
        assert state_before["g2"] == {"overall": {"ABC"[order.index("beta")]: 1}}
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
        summary = json.loads(serving.get("api/summary")[1])

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
                                ({"rater": "<script>"}, "rater '<script>'"), ({"rater": ""}, "rater ''")]:
            status, result = serving.post({**good, **change})
            assert status == 400 and message in result["error"], (change, result)
        assert serving.post([1, 2])[0] == 400
        assert not (out / ANSWERS_FILE).exists()
        # Clips are served from inside the run folders only.
        assert serving.get("clips/0/games/g1/turn_000.mp4")[0] == 200
        assert serving.get("clips/0/games/g1/turn_000.jpg")[0] == 200  # the poster made at start
        assert serving.get("clips/0/..%2F..%2Fbeta%2Feval%2Fmetrics.json")[0] == 404
        assert serving.get("clips/0/metrics.json")[0] == 404  # not a clip
        assert serving.get("clips/7/games/g1/turn_000.mp4")[0] == 404
        assert b'name="rater"' in serving.get("")[1]  # no name yet: the page asks for one


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
    labels = {game: {run: "ABC"[column_order("carol", game, list(RUNS)).index(run)] for run in RUNS} for game in GAMES}
    with Serving(runs, out) as serving, Browser(CHROMIUM) as browser:
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


def test_the_same_folder_twice_is_refused(runs, tmp_path):
    """Two names for one folder (or two spellings of its path): refused before anything is served."""
    from animegamer.errors import UserError

    other_spelling = Path(runs[0]).parent / "." / Path(runs[0]).name
    with pytest.raises(UserError, match="same evaluation folder more than once"):
        load_runs([runs[0], other_spelling], ["first", "second"])
