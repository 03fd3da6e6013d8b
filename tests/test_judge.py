"""The MLLM judge (Table 2) against a fake OpenAI-compatible server on 127.0.0.1: good answers,
malformed answers, timeouts, 429/500 with retry and the unavailable path; scores, spreads and the
report's table are checked exactly."""
from __future__ import annotations

import base64
import io
import json
import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator

import numpy as np
import pytest
from PIL import Image

from animegamer.config.schema import JudgeConfig
from animegamer.metrics.judge import (DIMENSIONS, JUDGE_PROMPT_VERSION, NO_ENDPOINT, JudgedGame, JudgedTurn,
                                      judge_games, judge_report_games, parse_scores, prompt_sha256, table2_lines)

KEY_ENV = "TEST_JUDGE_KEY"
SECRET = "sk-judge-secret-123"
FRAMES, HEIGHT, WIDTH = 9, 48, 96


# --------------------------------------------------------------------------- fake endpoint
class FakeJudge:
    """A chat-completions endpoint answering from a script of (status, text[, delay seconds])."""

    def __init__(self, script: list[tuple]) -> None:
        self.script = list(script)
        self.requests: list[dict[str, Any]] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server API
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                owner.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
                status, text, *delay = owner.script.pop(0) if owner.script else (500, "script exhausted")
                time.sleep(delay[0] if delay else 0.0)
                data = (json.dumps({"choices": [{"message": {"role": "assistant", "content": text}}]})
                        if status == 200 else text).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:  # the client gave up (timeout)
                    pass

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def __enter__(self) -> "FakeJudge":
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """urllib honours proxy variables; the local fake must be reached directly."""
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    yield


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
    with FakeJudge([(200, text) for text in game_1 + game_2]) as server:
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
    with FakeJudge(script) as server:
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
    with FakeJudge(script) as server:
        record = judge_games(config(server.url, samples=1, timeout_s=0.3), [a_game("g1")], backoff_s=0.0)
    assert len(server.requests) == 4
    assert record["per_game"][0]["samples"][0] == {"scores": dict(zip(DIMENSIONS, [6] * 6)), "attempts": 4, "error": ""}
    # A failed request re-sends the original prompt, without any feedback.
    assert all("previous answer" not in request_text(r) for r in server.requests)


def test_a_game_without_valid_answer_is_unavailable_never_guessed():
    script = [(500, "down")] * 2 + [(200, "no idea")] * 2 + [(200, answer(3, 4, 5, 6, 7, 8))] * 2
    with FakeJudge(script) as server:
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

    with FakeJudge([(503, "busy")] * 2) as server:
        record = judge_games(config(server.url, samples=1, retries=1), [a_game("g")], backoff_s=0.0)
    assert all(not m["available"] and m["value"] is None for m in record["scores"].values())
    assert record["scores"]["overall"]["reason"].startswith("no game scored: attempt 2/2: request failed: HTTP 503")


def test_no_endpoint_reports_every_dimension_unavailable_without_reading_clips(tmp_path):
    games = [{"id": "g1", "turns": [{"instruction": "x", "video": str(tmp_path / "missing.mp4"), "states": {}}]}]
    record = judge_report_games(JudgeConfig(), games)
    assert record["games"] == 1 and record["games_scored"] == 0 and record["model"] is None
    assert record["scores"] == {key: {"value": None, "available": False, "reason": NO_ENDPOINT} for key in DIMENSIONS}


def test_unreachable_endpoint_is_unavailable():
    with FakeJudge([]) as server:
        url = server.url
    record = judge_games(config(url, samples=1, retries=0), [a_game("g")], backoff_s=0.0)
    reason = record["scores"]["overall"]["reason"]
    assert reason.startswith("no game scored: attempt 1/1: request failed: cannot reach"), reason
    assert record["games_scored"] == 0


# --------------------------------------------------------------------------- evaluation's games and the report
def report_games(folder) -> list[dict]:
    """One played game of two turns in evaluation's report format, its clips real mp4 files."""
    from animegamer.config.schema import ClipsConfig
    from data_pipeline.clips import encode_mp4

    frames = np.full((FRAMES, HEIGHT, WIDTH, 3), 120, dtype=np.uint8)
    rows = []
    for t in range(2):
        video = folder / "games" / "g1" / f"turn_{t:03d}.mp4"
        video.parent.mkdir(parents=True, exist_ok=True)
        video.write_bytes(encode_mp4(frames, 8, ClipsConfig()))
        rows.append({"instruction": f"Character: Qiqi; Motion: walk {t}; Background: noon town.", "video": str(video),
                     "states": {"ML": 3, "SC": 0, "ET": 1, "ST": -1}, "metrics": {}})
    return [{"id": "g1", "turns": rows, "completed": 2, "planned": 2}]


def test_report_games_are_decoded_and_table2_is_written_exactly(tmp_path, monkeypatch):
    from animegamer.metrics.report import write_report

    monkeypatch.delenv(KEY_ENV, raising=False)
    games = report_games(tmp_path)
    with FakeJudge([(200, answer(6, 7, 8, 9, 10, 5)), (200, answer(8, 7, 8, 9, 10, 3))]) as server:
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
    from animegamer.metrics.judge import main
    from animegamer.metrics.report import PAPER_TABLE1, write_report

    folder = tmp_path / "eval"
    write_report(folder, {"clip_i": 0.5, "judge": judge_report_games(JudgeConfig(), [])}, report_games(folder),
                 paper=PAPER_TABLE1)
    assert f"| Overall | n/a ({NO_ENDPOINT}) | not recorded |" in (folder / "report.md").read_text()
    with FakeJudge([(200, answer(4, 5, 6, 7, 8, 9))]) as server:
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


# --------------------------------------------------------------------------- configuration
def test_judge_settings_are_validated_with_every_problem_listed():
    from animegamer.config.compose import compose_config
    from animegamer.metrics.judge import check_judge

    assert check_judge(JudgeConfig()) == []
    assert check_judge(JudgeConfig(url="http://127.0.0.1:8000/v1", model_name="m")) == []
    problems = check_judge(JudgeConfig(url="ftp://host/v1", api_key_env="sk-abc123", samples=0, frames_per_turn=0,
                                       retries=-1, temperature=3.0))
    assert len(problems) == 7, problems
    assert any("evaluation.judge.url='ftp://host/v1'" in p for p in problems)
    assert any("model_name is empty" in p for p in problems)
    assert any("api_key_env must name an environment variable" in p and "sk-abc123" not in p for p in problems)
    assert any("evaluation.judge.samples=0 must be > 0" in p for p in problems)
    assert any("evaluation.judge.frames_per_turn=0 must be > 0" in p for p in problems)
    assert any("retries=-1" in p for p in problems) and any("temperature=3.0" in p for p in problems)
    composed = compose_config("evaluate", ["evaluation.judge.url=http://127.0.0.1:9/v1", "evaluation.judge.samples=5"])
    assert composed.evaluation.judge.samples == 5 and composed.evaluation.judge.api_key_env == "OPENAI_API_KEY"
