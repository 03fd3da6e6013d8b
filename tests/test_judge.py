"""The MLLM judge (Table 2) against a fake OpenAI-compatible server on 127.0.0.1: good answers,
malformed answers, timeouts, 429/500 with retry and the unavailable path; scores, spreads and the
report's table are checked exactly."""
from __future__ import annotations

import base64
import io
import json
import logging
import re
import time
from typing import Any

import numpy as np
import pytest
from http_fakes import FakeChatServer, huge, no_proxy, redirect, silent, trickle  # noqa: F401 - no_proxy: autouse
from PIL import Image

from animegamer.config.schema import JudgeConfig
from animegamer.utils.http import ERROR_DETAIL_CHARS
from animegamer.evaluation.judge import (DIMENSIONS, JUDGE_PROMPT_VERSION, NO_ENDPOINT, JudgedGame, JudgedTurn,
                                      judge_games, judge_report_games, parse_scores, prompt_sha256, request_parts)
from animegamer.evaluation.judge_record import table2_lines

KEY_ENV = "TEST_JUDGE_KEY"
SECRET = "sk-judge-secret-123"
FRAMES, HEIGHT, WIDTH = 9, 48, 96


def answer(*values: int) -> str:
    return json.dumps(dict(zip(DIMENSIONS, values)))


def config(url: str, **overrides: Any) -> JudgeConfig:
    base = dict(url=url, model_name="fake-vlm", api_key_env=KEY_ENV, samples=3, frames_per_turn=3,
                image_max_side=32, temperature=0.7, max_tokens=200, retries=3, timeout_s=5.0)
    return JudgeConfig(**{**base, **overrides})


def a_game(name: str, turns: int = 2) -> JudgedGame:
    rng = np.random.default_rng(len(name))
    return JudgedGame(name, tuple(
        JudgedTurn(f"Character: Qiqi; Motion: softly talk {t}; Background: evening forest.",
                   rng.integers(0, 255, (FRAMES, HEIGHT, WIDTH, 3), dtype=np.uint8),
                   {"ML": 2, "SC": 1, "ET": 0, "ST": -1}) for t in range(turns)))


def request_text(request: dict) -> str:
    return "\n".join(p["text"] for p in request["body"]["messages"][0]["content"] if p["type"] == "text")


def request_images(request: dict) -> list[Image.Image]:
    urls = [p["image_url"]["url"] for p in request["body"]["messages"][0]["content"] if p["type"] == "image_url"]
    assert all(u.startswith("data:image/png;base64,") for u in urls)
    return [Image.open(io.BytesIO(base64.b64decode(u.split(",", 1)[1]))) for u in urls]


# --------------------------------------------------------------------------- parsing
def test_parse_accepts_exactly_six_integers_in_range():
    assert parse_scores(answer(1, 2, 3, 4, 5, 10)) == dict(zip(DIMENSIONS, (1, 2, 3, 4, 5, 10)))
    assert parse_scores(f"```json\n{answer(7, 7, 7, 7, 7, 7)}\n```")["overall"] == 7
    bad = {
        "Sure, it is a 7.": "not a single JSON object",
        f"Here: {answer(7, 7, 7, 7, 7, 7)}": "not a single JSON object",
        "[7, 7]": "must be a JSON object, got list",
        json.dumps({"overall": 7}): "missing ['instruction_following'",
        json.dumps({**dict(zip(DIMENSIONS, [5] * 6)), "fun": 3}): "unknown ['fun']",
        answer(11, 5, 5, 5, 5, 5): '"overall" must be an integer from 1 to 10, got 11',
        answer(5, 0, 5, 5, 5, 5): '"instruction_following" must be an integer from 1 to 10, got 0',
        answer(5, 5, 5, 5, 5, 5).replace('"state_update": 5', '"state_update": 5.0'): "got 5.0",
        answer(5, 5, 5, 5, 5, 5).replace('"overall": 5', '"overall": "5"'): "got '5'",
        answer(5, 5, 5, 5, 5, 5).replace('"overall": 5', '"overall": true'): "got True",
    }
    for text, message in bad.items():
        with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("(", r"\(")):
            parse_scores(text)


# --------------------------------------------------------------------------- good answers
def test_good_answers_give_exact_means_spreads_and_requests(monkeypatch, caplog):
    monkeypatch.setenv(KEY_ENV, SECRET)
    game_1 = [answer(6, 5, 5, 8, 9, 3), answer(8, 5, 6, 8, 9, 4), answer(7, 5, 7, 8, 9, 5)]
    game_2 = [answer(4, 2, 3, 9, 9, 1), answer(4, 3, 3, 9, 9, 1), answer(5, 4, 3, 9, 9, 1)]
    caplog.set_level(logging.DEBUG)
    with FakeChatServer([(200, text) for text in game_1 + game_2]) as server:
        record = judge_games(config(server.url), [a_game("g1", turns=2), a_game("g2", turns=3)], backoff_s=0.0)
    assert len(server.requests) == 6
    per_game = {g["id"]: g for g in record["per_game"]}
    assert per_game["g1"]["mean"] == {"overall": 7, "instruction_following": 5, "contextual_consistency": 6,
                                      "character_consistency": 8, "style_consistency": 9, "state_update": 4}
    assert per_game["g1"]["sd"]["overall"] == pytest.approx(1.0) and per_game["g1"]["sd"]["character_consistency"] == 0
    assert per_game["g2"]["mean"]["instruction_following"] == 3 and per_game["g2"]["sd"]["instruction_following"] == 1
    assert record["games"] == record["games_scored"] == 2
    scores = {key: metric["value"] for key, metric in record["scores"].items()}
    assert scores == pytest.approx({"overall": (7 + 13 / 3) / 2, "instruction_following": 4.0,
                                    "contextual_consistency": 4.5, "character_consistency": 8.5,
                                    "style_consistency": 9.0, "state_update": 2.5})
    assert record["spread"]["overall"] == pytest.approx((1.0 + np.std([4, 4, 5], ddof=1)) / 2)
    assert record["spread"]["state_update"] == pytest.approx(0.5) and record["spread"]["style_consistency"] == 0
    assert record["model"] == "fake-vlm" and record["prompt_version"] == JUDGE_PROMPT_VERSION
    assert record["endpoint"] == server.url and record["samples_per_game"] == 3

    first = server.requests[0]
    assert first["path"] == "/v1/chat/completions"
    assert first["headers"]["Authorization"] == f"Bearer {SECRET}"
    body = first["body"]
    assert body["model"] == "fake-vlm" and body["temperature"] == 0.7 and body["max_tokens"] == 200
    images = request_images(first)
    assert len(images) == 2 * 3 and all(image.size == (32, 16) for image in images)  # 96x48 scaled to side 32
    text = request_text(first)
    assert "one game of 2 turns" in text and "Motion: softly talk 1" in text
    assert "SC +1 (50 -> 55), ET 0 (50 -> 50), ST -1 (50 -> 45)" in text  # turn 1
    assert "SC +1 (55 -> 60), ET 0 (50 -> 50), ST -1 (45 -> 40)" in text  # turn 2 continues from turn 1
    assert all(f'"{key}": <integer>' in text for key in DIMENSIONS)
    assert len(request_images(server.requests[3])) == 3 * 3  # game 2 has three turns
    # The key travels in the header only: not in the record, not in any log line.
    assert SECRET not in json.dumps(record) and SECRET not in caplog.text


# --------------------------------------------------------------------------- retries
def test_malformed_answers_are_asked_again_with_the_reason():
    script = [(200, "I would give it a 7."), (200, json.dumps({"overall": 7})), (200, answer(11, 5, 5, 5, 5, 5)),
              (200, answer(9, 8, 7, 6, 5, 4))]
    with FakeChatServer(script) as server:
        record = judge_games(config(server.url, samples=1), [a_game("g1")], backoff_s=0.0)
    sample = record["per_game"][0]["samples"][0]
    assert sample == {"scores": dict(zip(DIMENSIONS, (9, 8, 7, 6, 5, 4))), "attempts": 4, "error": ""}
    texts = [request_text(r) for r in server.requests]
    assert "previous answer" not in texts[0]
    assert "Your previous answer could not be used: the answer is not a single JSON object" in texts[1]
    assert "missing ['instruction_following'" in texts[2]
    assert '"overall" must be an integer from 1 to 10, got 11' in texts[3]
    assert record["scores"]["overall"]["value"] == 9 and record["spread"]["overall"] is None  # one sample: no spread


def test_429_500_and_timeouts_are_retried_then_scored():
    script = [(429, '{"error": "rate limited"}'), (500, '{"error": "overloaded"}'),
              (200, answer(5, 5, 5, 5, 5, 5), 1.0), (200, answer(6, 6, 6, 6, 6, 6))]  # the third one comes too late
    with FakeChatServer(script) as server:
        record = judge_games(config(server.url, samples=1, timeout_s=0.3), [a_game("g1")], backoff_s=0.0)
    assert len(server.requests) == 4
    assert record["per_game"][0]["samples"][0] == {"scores": dict(zip(DIMENSIONS, [6] * 6)), "attempts": 4, "error": ""}
    # A failed request re-sends the original prompt, without any feedback.
    assert all("previous answer" not in request_text(r) for r in server.requests)


def test_a_game_without_valid_answer_is_unavailable_never_guessed():
    script = [(500, "down")] * 2 + [(200, "no idea")] * 2 + [(200, answer(3, 4, 5, 6, 7, 8))] * 2
    with FakeChatServer(script) as server:
        record = judge_games(config(server.url, samples=2, retries=1), [a_game("bad"), a_game("good")], backoff_s=0.0)
    bad, good = record["per_game"]
    assert bad["mean"] is None and bad["valid_samples"] == 0 and [s["scores"] for s in bad["samples"]] == [None, None]
    assert bad["samples"][0]["error"].startswith("attempt 2/2: request failed: HTTP 500")
    assert bad["samples"][1]["error"].startswith("attempt 2/2: unusable answer:")
    assert record["games"] == 2 and record["games_scored"] == 1
    assert record["scores"]["overall"] == {"value": 3.0, "available": True}  # the scored game only
    lines = table2_lines(record)
    assert lines[2].endswith("1 of 2 games scored, 2 samples per game, 3 frames per turn.")
    assert lines[-1].startswith("Games without a valid judgement (not scored, not a zero): bad: attempt 2/2: unusable")

    with FakeChatServer([(503, "busy")] * 2) as server:
        record = judge_games(config(server.url, samples=1, retries=1), [a_game("g")], backoff_s=0.0)
    assert all(not m["available"] and m["value"] is None for m in record["scores"].values())
    assert record["scores"]["overall"]["reason"].startswith("no game scored: attempt 2/2: request failed: HTTP 503")


def test_no_endpoint_reports_every_dimension_unavailable_without_reading_clips(tmp_path):
    games = [{"id": "g1", "turns": [{"instruction": "x", "video": str(tmp_path / "missing.mp4"), "states": {}}]}]
    record = judge_report_games(JudgeConfig(), games)
    assert record["games"] == 1 and record["games_scored"] == 0 and record["model"] is None
    assert record["scores"] == {key: {"value": None, "available": False, "reason": NO_ENDPOINT} for key in DIMENSIONS}


def test_unreachable_endpoint_is_unavailable():
    with FakeChatServer([]) as server:
        url = server.url
    record = judge_games(config(url, samples=1, retries=0), [a_game("g")], backoff_s=0.0)
    reason = record["scores"]["overall"]["reason"]
    assert reason.startswith("no game scored: attempt 1/1: request failed: cannot reach"), reason
    assert record["games_scored"] == 0


# --------------------------------------------------------------------------- evaluation's games and the report
def report_games(folder, ids: tuple[str, ...] = ("g1",)) -> list[dict]:
    """Played games of two turns each in evaluation's report format, their clips real mp4 files."""
    from animegamer.config.schema import ClipsConfig
    from animegamer.media.video import encode_mp4

    frames = np.full((FRAMES, HEIGHT, WIDTH, 3), 120, dtype=np.uint8)
    games = []
    for game_id in ids:
        rows = []
        for t in range(2):
            video = folder / "games" / game_id / f"turn_{t:03d}.mp4"
            video.parent.mkdir(parents=True, exist_ok=True)
            video.write_bytes(encode_mp4(frames, 8, ClipsConfig()))
            rows.append({"instruction": f"Character: Qiqi; Motion: walk {t}; Background: noon town.",
                         "video": str(video), "states": {"ML": 3, "SC": 0, "ET": 1, "ST": -1}, "metrics": {}})
        games.append({"id": game_id, "turns": rows, "completed": 2, "planned": 2})
    return games


def test_report_games_are_decoded_and_table2_is_written_exactly(tmp_path, monkeypatch):
    from animegamer.evaluation.report import write_report

    monkeypatch.delenv(KEY_ENV, raising=False)
    games = report_games(tmp_path)
    with FakeChatServer([(200, answer(6, 7, 8, 9, 10, 5)), (200, answer(8, 7, 8, 9, 10, 3))]) as server:
        record = judge_report_games(config(server.url, samples=2, image_max_side=64), games, backoff_s=0.0)
    assert "Authorization" not in server.requests[0]["headers"]  # no key in the environment: none sent
    assert [image.size for image in request_images(server.requests[0])] == [(64, 32)] * 6
    assert np.allclose(np.asarray(request_images(server.requests[0])[0], dtype=float).mean(), 120, atol=3)

    write_report(tmp_path / "eval", {"judge": record}, games)
    report = (tmp_path / "eval" / "report.md").read_text().splitlines()
    start = report.index("## Table 2: MLLM judge")
    assert report[start:start + 13] == [
        "## Table 2: MLLM judge",
        "",
        f"Judge: `fake-vlm`; prompt version {JUDGE_PROMPT_VERSION} (sha256 {prompt_sha256()}); 1 of 1 games scored, "
        "2 samples per game, 3 frames per turn.",
        "",
        "| Dimension | Ours (mean ± sd) | Paper (GPT-4V) |",
        "|---|---|---|",
        "| Overall | 7.00 ± 1.41 | not recorded |",
        "| Instruction following | 7.00 ± 0.00 | not recorded |",
        "| Contextual consistency | 8.00 ± 0.00 | not recorded |",
        "| Character consistency | 9.00 ± 0.00 | not recorded |",
        "| Style consistency | 10.00 ± 0.00 | not recorded |",
        "| State update | 4.00 ± 1.41 | not recorded |",
        "",
    ]
    saved = json.loads((tmp_path / "eval" / "metrics.json").read_text())["metrics"]["judge"]
    assert saved["scores"]["overall"] == {"value": 7.0, "available": True} and saved["spread"]["overall"] == 2 ** 0.5

    write_report(tmp_path / "none", {"judge": judge_report_games(JudgeConfig(), games)}, games)
    text = (tmp_path / "none" / "report.md").read_text()
    assert f"| Overall | n/a ({NO_ENDPOINT}) | not recorded |" in text and "Judge: none;" in text


def test_a_finished_evaluation_is_judged_again_without_playing(tmp_path, capsys):
    from animegamer.evaluation.judge import main
    from animegamer.evaluation.report import PAPER_TABLE1, write_report

    folder = tmp_path / "eval"
    write_report(folder, {"clip_i": 0.5, "judge": judge_report_games(JudgeConfig(), [])}, report_games(folder),
                 paper=PAPER_TABLE1)
    assert f"| Overall | n/a ({NO_ENDPOINT}) | not recorded |" in (folder / "report.md").read_text()
    with FakeChatServer([(200, answer(4, 5, 6, 7, 8, 9))]) as server:
        assert main([str(folder), f"evaluation.judge.url={server.url}", "evaluation.judge.model_name=fake-vlm",
                     "evaluation.judge.samples=1", f"evaluation.judge.api_key_env={KEY_ENV}"]) == 0
    assert len(request_images(server.requests[0])) == 2 * 4  # frames_per_turn defaults to 4
    saved = json.loads((folder / "metrics.json").read_text())
    assert saved["metrics"]["judge"]["scores"]["state_update"] == {"value": 9.0, "available": True}
    assert saved["metrics"]["clip_i"] == 0.5 and saved["games"][0]["turns"][0]["video"] == "games/g1/turn_000.mp4"
    report = (folder / "report.md").read_text()
    assert "| Overall | 4.00 | not recorded |" in report and "| CLIP-I | 0.5000 | 0.8132 |" in report
    with pytest.raises(SystemExit) as exit_info:
        main([str(folder), "evaluation.judge.model_name=fake-vlm"])
    assert exit_info.value.code == 2 and "evaluation.judge.url is empty" in capsys.readouterr().err
    # Judged again by an endpoint that is down: no game scored, so the scores above stay, files untouched.
    kept = {name: (folder / name).read_bytes() for name in ("metrics.json", "report.md")}
    with FakeChatServer([]) as server:
        down = server.url
    with pytest.raises(SystemExit) as exit_info:
        main([str(folder), f"evaluation.judge.url={down}", "evaluation.judge.model_name=fake-vlm",
              "evaluation.judge.samples=1", "evaluation.judge.retries=0"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "the judge scored no game (no game scored: attempt 1/1" in err, err
    assert "the earlier judge record (1 of 1 games scored) is kept" in err
    assert {name: (folder / name).read_bytes() for name in kept} == kept


# --------------------------------------------------------------------------- configuration
def test_judge_settings_are_validated_with_every_problem_listed():
    from animegamer.config.compose import compose_config
    from animegamer.evaluation.judge import check_judge

    assert check_judge(JudgeConfig()) == []
    assert check_judge(JudgeConfig(url="http://127.0.0.1:8000/v1", model_name="m")) == []
    problems = check_judge(JudgeConfig(url="ftp://host/v1", api_key_env="sk-abc123", samples=0, frames_per_turn=0,
                                       retries=-1, temperature=3.0, deadline_s=0, budget_s=-1))
    assert len(problems) == 9, problems
    assert "evaluation.judge.deadline_s=0 must be > 0" in problems
    assert "evaluation.judge.budget_s=-1 must be >= 0 (0: no limit)" in problems
    assert any("evaluation.judge.url='ftp://host/v1'" in p for p in problems)
    assert any("model_name is empty" in p for p in problems)
    assert any("api_key_env must name an environment variable" in p and "sk-abc123" not in p for p in problems)
    assert any("evaluation.judge.samples=0 must be > 0" in p for p in problems)
    assert any("evaluation.judge.frames_per_turn=0 must be > 0" in p for p in problems)
    assert any("retries=-1" in p for p in problems) and any("temperature=3.0" in p for p in problems)
    composed = compose_config("evaluate", ["evaluation.judge.url=http://127.0.0.1:9/v1", "evaluation.judge.samples=5"])
    assert composed.evaluation.judge.samples == 5 and composed.evaluation.judge.api_key_env == "OPENAI_API_KEY"


# --------------------------------------------------------------------------- limits, credentials and secrets
URL_PASSWORD = "pw-judge-secret-0815"
QUERY_KEY = "qk-judge-secret-2342"


def test_a_trickled_answer_is_cut_at_the_request_deadline():
    """A byte every 0.2 s keeps each read within timeout_s: only the whole request's deadline ends it."""
    with FakeChatServer([trickle(answer(5, 5, 5, 5, 5, 5), 0.2)]) as server:
        started = time.monotonic()
        record = judge_games(config(server.url, samples=1, retries=0, deadline_s=0.5), [a_game("g")], backoff_s=0.0)
        elapsed = time.monotonic() - started
    assert record["games_scored"] == 0 and record["deadline_s"] == 0.5
    reason = record["per_game"][0]["reason"]
    assert "within the request deadline of 0.5 s (evaluation.judge.deadline_s)" in reason, reason
    assert 0.5 <= elapsed < 3.0  # the whole answer would have taken len(body) * 0.2 s > 20 s


def test_a_silent_server_costs_the_run_budget_then_the_games_left_are_unscored():
    with FakeChatServer([], otherwise=silent) as server:
        started = time.monotonic()
        record = judge_games(config(server.url, deadline_s=0.3, budget_s=0.5), [a_game("g1"), a_game("g2")],
                             backoff_s=0.0)
        elapsed = time.monotonic() - started
    # g1's first sample: its first attempt ends at the 0.3 s deadline, its second at the budget's last
    # 0.2 s (not retried); no request after that.
    assert len(server.requests) == 2 and 0.5 <= elapsed < 3.0, elapsed
    assert record["budget_exhausted"] is True and record["games_scored"] == 0 and record["budget_s"] == 0.5
    g1, g2 = record["per_game"]
    assert [s["attempts"] for s in g1["samples"]] == [2, 1, 1] and [s["attempts"] for s in g2["samples"]] == [1, 1, 1]
    assert "ran out during a request" in g1["samples"][0]["error"]
    assert g2["reason"].endswith("request budget of 0.5 s (evaluation.judge.budget_s) is spent: no request sent")
    lines = table2_lines(record)
    assert ("The judge's request budget (evaluation.judge.budget_s = 0.5 s) ran out: the games judged after that "
            "are not scored.") in lines


def test_a_huge_answer_is_refused_at_the_cap_without_holding_it(monkeypatch, caplog):
    import tracemalloc

    import animegamer.utils.http as http_client

    cap, total = 64 * 1024, 40 * 2**20
    monkeypatch.setattr(http_client, "MAX_RESPONSE_BYTES", cap)
    good = answer(5, 5, 5, 5, 5, 5)  # after 40 MB of whitespace: only the size is wrong
    game = a_game("g")
    request_parts(game, 3, 32)  # the prompt's first rendering imports its libraries: not what is measured
    with FakeChatServer([huge(total, announce=True, text=good), huge(total, announce=False, text=good)]) as server:
        tracemalloc.start()
        try:
            record = judge_games(config(server.url, samples=1, retries=1), [game], backoff_s=0.0)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert len(server.requests) == 2 and record["games_scored"] == 0
    assert (f"attempt 1/2: request failed: the answer from {server.url}/chat/completions announces {total} bytes, "
            f"over the cap of {cap} bytes on an answer; not read") in caplog.text
    reason = record["per_game"][0]["reason"]  # the second body announces no size: read until past the cap
    assert reason.endswith(f"exceeds the cap of {cap} bytes on an answer; reading stopped"), reason
    assert peak < 4 * 2**20, peak  # the request's images and a capped body, never near one body (40 MiB)
    assert server.sent_bytes < total  # neither body was read to its end


def test_authorization_goes_to_no_other_origin_on_a_redirect(monkeypatch):
    monkeypatch.setenv(KEY_ENV, SECRET)
    good = answer(5, 5, 5, 5, 5, 5)
    with FakeChatServer([(200, good)] * 2) as other, FakeChatServer([]) as server:
        # another host name (and port), the same host on another port, the endpoint's own origin
        targets = [other.url_on("localhost"), other.url, server.url]
        server.script = [redirect(target + "/chat/completions") for target in targets] + [(200, good)]
        records = [judge_games(config(server.url, samples=1, retries=0), [a_game("g")], backoff_s=0.0)
                   for _ in targets]
    assert [r["games_scored"] for r in records] == [1, 1, 1]
    assert [r["headers"].get("Authorization") for r in server.requests] == [f"Bearer {SECRET}"] * 4
    assert [r["method"] for r in other.requests] == ["GET", "GET"]
    assert [r["headers"].get("Authorization") for r in other.requests] == [None, None]
    assert server.requests[3]["method"] == "GET"  # the same origin: the key is kept


@pytest.mark.parametrize("status", [401, 403])
def test_a_refused_key_is_not_retried(monkeypatch, status):
    monkeypatch.setenv(KEY_ENV, SECRET)
    with FakeChatServer([], otherwise=(status, '{"error": "invalid api key"}')) as server:
        record = judge_games(config(server.url, samples=1, retries=3), [a_game("g")], backoff_s=0.0)
    assert len(server.requests) == 1
    reason = record["per_game"][0]["reason"]
    assert reason.startswith(f"attempt 1/4: request failed: HTTP {status} ") and "not retried" in reason, reason
    assert "evaluation.judge.api_key_env" in reason and "invalid api key" in reason


def test_a_key_echoed_by_the_server_reaches_no_report_record_or_log(tmp_path, monkeypatch, caplog):
    """The key (from the environment), and a password and a query key in the endpoint URL, echoed in
    the server's error body: report.md, metrics.json and the log mask all three."""
    from animegamer.evaluation.report import write_report

    monkeypatch.setenv(KEY_ENV, SECRET)
    echo = json.dumps({"error": f"bad key {SECRET} (password {URL_PASSWORD}, key {QUERY_KEY})"})
    games = report_games(tmp_path)
    caplog.set_level(logging.DEBUG)
    # the 500's body puts the key across the point where an error message's quote of it is cut
    cut_across = "x" * (ERROR_DETAIL_CHARS - len(SECRET) // 2) + SECRET
    with FakeChatServer([(500, cut_across), (401, echo)]) as server:
        url = f"http://judge:{URL_PASSWORD}@127.0.0.1:{server.port}/v1?key={QUERY_KEY}"
        record = judge_report_games(config(url, samples=1, retries=1), games, backoff_s=0.0)
    assert len(server.requests) == 2  # the request reached the server, with the key and the query
    assert server.requests[0]["headers"]["Authorization"] == f"Bearer {SECRET}"
    assert server.requests[0]["path"] == f"/v1/chat/completions?key={QUERY_KEY}"
    assert record["endpoint"] == f"http://***@127.0.0.1:{server.port}/v1?key=***"
    assert "bad key *** (password ***, key ***)" in record["per_game"][0]["reason"]
    write_report(tmp_path / "eval", {"judge": record}, games)
    texts = {"report.md": (tmp_path / "eval" / "report.md").read_text(),
             "metrics.json": (tmp_path / "eval" / "metrics.json").read_text(), "log": caplog.text}
    assert "HTTP 401" in texts["report.md"] and "HTTP 500" in texts["log"]
    for name, text in texts.items():
        for secret in (SECRET, SECRET[: len(SECRET) // 2], URL_PASSWORD, QUERY_KEY):
            assert secret not in text, f"{secret} in {name}"


def test_a_password_in_the_url_is_sent_as_basic_credentials_and_never_shown():
    with FakeChatServer([(200, answer(5, 5, 5, 5, 5, 5))]) as server:
        url = f"http://judge:{URL_PASSWORD}@127.0.0.1:{server.port}/v1"
        record = judge_games(config(url, samples=1, retries=0, api_key_env=""), [a_game("g")], backoff_s=0.0)
    assert record["games_scored"] == 1
    sent = server.requests[0]["headers"]["Authorization"]
    assert sent == "Basic " + base64.b64encode(f"judge:{URL_PASSWORD}".encode()).decode()
    assert record["endpoint"] == f"http://***@127.0.0.1:{server.port}/v1"


# --------------------------------------------------------------------------- games the judge cannot see whole
def test_a_game_with_a_missing_clip_is_unscored_and_the_others_judged(tmp_path):
    games = report_games(tmp_path, ("g1", "g2"))
    missing = games[0]["turns"][1]["video"]
    (tmp_path / "games" / "g1" / "turn_001.mp4").unlink()
    with FakeChatServer([(200, answer(6, 6, 6, 6, 6, 6))]) as server:
        record = judge_report_games(config(server.url, samples=1, retries=0), games, backoff_s=0.0)
    assert len(server.requests) == 1 and "one game of 2 turns" in request_text(server.requests[0])  # g2, whole
    assert record["games"] == 2 and record["games_scored"] == 1
    g1, g2 = record["per_game"]
    assert g1["reason"] == f"turn 2: clip {missing} is missing" and g1["samples"] == [] and g2["mean"]["overall"] == 6
    lines = table2_lines(record)
    assert lines[2].endswith("1 of 2 games scored, 1 samples per game, 3 frames per turn.")
    assert lines[-1] == ("Games without a valid judgement (not scored, not a zero): "
                         f"g1: turn 2: clip {missing} is missing.")


def test_a_truncated_clip_leaves_its_game_unscored_and_the_rejudge_finishes(tmp_path):
    from animegamer.evaluation.judge import main
    from animegamer.evaluation.report import write_report

    folder = tmp_path / "eval"
    write_report(folder, {"judge": judge_report_games(JudgeConfig(), [])}, report_games(folder, ("g1", "g2")))
    clip = folder / "games" / "g1" / "turn_000.mp4"
    clip.write_bytes(clip.read_bytes()[: clip.stat().st_size // 2])
    with FakeChatServer([(200, answer(4, 5, 6, 7, 8, 9))]) as server:
        assert main([str(folder), f"evaluation.judge.url={server.url}", "evaluation.judge.model_name=fake-vlm",
                     "evaluation.judge.samples=1", f"evaluation.judge.api_key_env={KEY_ENV}"]) == 0
    assert len(server.requests) == 1
    saved = json.loads((folder / "metrics.json").read_text())["metrics"]["judge"]
    assert saved["games"] == 2 and saved["games_scored"] == 1
    assert saved["per_game"][0]["reason"].startswith(f"turn 1: clip {clip} cannot be decoded (")
    assert saved["scores"]["state_update"] == {"value": 9.0, "available": True}  # g2's
    report = (folder / "report.md").read_text()
    assert "1 of 2 games scored" in report and f"g1: turn 1: clip {clip} cannot be decoded" in report


def test_a_pipe_in_the_judges_answer_cannot_forge_a_table_cell():
    from animegamer.evaluation.drawing import markdown_cell

    forged = "| 9.00 ± 0.00 | not recorded |\n| Overall"
    with FakeChatServer([(200, forged)]) as server:
        record = judge_games(config(server.url, samples=1, retries=0), [a_game("g")], backoff_s=0.0)
    assert record["games_scored"] == 0
    rows = [line for line in table2_lines(record) if line.startswith("| ") and not line.startswith("| Dimension")]
    assert len(rows) == len(DIMENSIONS)
    for row in rows:
        cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", row)[1:-1]]  # a Markdown renderer's split
        assert len(cells) == 3 and cells[1].startswith("n/a (no game scored: attempt 1/1: unusable answer")
        assert cells[2] == "not recorded" and "9.00" not in (cells[1].split("±")[0].strip(), cells[2])
    assert markdown_cell("a|b\\|c\nd") == "a\\|b\\\\\\|c d"
