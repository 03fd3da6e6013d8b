"""Caption failures of the http backend are neither sticky nor quiet, and no secret reaches a recorded command.

One output folder goes through four runs over the toy film (10 clips): a server answering 500 (every
clip fails: the run stops with exit 2 after writing, with a WARNING summary), a server that answers 4
clips and fails the rest (the failed clips are asked again, the run goes on and warns), a run with
``retry_failed=false`` (nothing asked) and a healthy server (only the 6 clips still failed are asked).
The command line of the runs names the endpoint with a password and a query key.
"""
from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
from conftest import pipeline_overrides, run_pipeline
from http_fakes import PROXY_VARIABLES, FakeChatServer, no_proxy  # noqa: F401 - no_proxy: autouse

from animegamer.config.compose import compose_config
from animegamer.config.schema import CaptionConfig
from animegamer.config.validate import ConfigError
from animegamer.errors import UserError
from animegamer.utils.command import recorded_command
from data_pipeline.captioners.failures import CaptionsFailedError
from data_pipeline.captioners.probe import probe_problems

GOOD_TEXT = json.dumps({"character": "Sosuke", "motion": "talk", "adverb": "softly", "environment": "seaside village",
                        "time_of_day": "evening", "states": {"SC": 1, "ET": 0, "ST": -1}})
PASSWORD = "pw-command-secret-0815"
QUERY_KEY = "qk-command-secret-2342"
CLIPS = 10  # the toy film's shots, one clip each
ANSWERED = 4  # clips the second run's server captions before failing again
PROBE = "GET"  # the pre-flight's request; the clips' requests are POSTs


def _overrides(output: Path, film: Path, url: str, *extra: str) -> list[str]:
    return pipeline_overrides(output, [film], None, "pipeline.caption.backend=http", f"pipeline.caption.url='{url}'",
                              "pipeline.caption.model_name=tiny-vl", "pipeline.caption.api_key_env=TEST_CAPTION_KEY",
                              "pipeline.caption.retries=0", "pipeline.caption.num_frames=2", "pipeline.workers=1",
                              "pipeline.clips.max_clips_per_shot=1", "pipeline.steps=[process,finalize]", *extra)


def _posts(server: FakeChatServer) -> int:
    return sum(request["method"] == "POST" for request in server.requests)


class _Records(logging.Handler):
    """The pipeline's warnings (the run sets up the root logger again: this handler sits below it)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())

    def take(self) -> list[str]:
        taken, self.messages = self.messages, []
        return taken


@pytest.fixture(scope="module")
def runs(toy_film: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    output = tmp_path_factory.mktemp("caption_failures") / "out"
    film = toy_film.video_path
    records = _Records()
    logging.getLogger("data_pipeline").addHandler(records)
    seen: dict[str, Any] = {"output": output}
    with pytest.MonkeyPatch.context() as patch:
        for var in PROXY_VARIABLES:
            patch.delenv(var, raising=False)
        patch.setenv("no_proxy", "127.0.0.1,localhost")
        with FakeChatServer([], otherwise=(500, '{"error": "overloaded"}')) as down:
            url = f"http://user:{PASSWORD}@127.0.0.1:{down.port}/v1?key={QUERY_KEY}"
            seen["argv"] = ["python", "-m", "data_pipeline", f"pipeline.caption.url={url}"]
            patch.setattr(sys, "argv", seen["argv"])
            try:  # the test below expects it to stop; the other runs go on from what it wrote
                run_pipeline(_overrides(output, film, url))
                seen["failed"] = None
            except CaptionsFailedError as error:
                seen["failed"] = error
        seen["failed_warnings"], seen["down_posts"] = records.take(), _posts(down)
        seen["failed_manifest"] = json.loads((output / "clips" / "manifest.json").read_text())
        seen["failed_report"] = json.loads((output / "report.json").read_text())

        script = [(200, "a models list")] + [(200, GOOD_TEXT)] * ANSWERED  # then 500s
        with FakeChatServer(script, otherwise=(500, "overloaded again")) as flaky:
            seen["partial"] = run_pipeline(_overrides(output, film, flaky.url))
        seen["partial_warnings"], seen["flaky_posts"] = records.take(), _posts(flaky)

        with FakeChatServer([], otherwise=(200, GOOD_TEXT)) as idle:
            seen["kept"] = run_pipeline(_overrides(output, film, idle.url, "pipeline.caption.retry_failed=false"))
        seen["idle_requests"] = len(idle.requests)

        with FakeChatServer([], otherwise=(200, GOOD_TEXT)) as healthy:
            seen["healthy"] = run_pipeline(_overrides(output, film, healthy.url, "pipeline.steps=[process,finalize,sessions]"))
        seen["healthy_posts"], seen["healthy_methods"] = _posts(healthy), [r["method"] for r in healthy.requests]
    logging.getLogger("data_pipeline").removeHandler(records)
    yield seen


def test_all_failed_captions_stop_the_run_after_writing_with_a_warning_summary(runs: dict[str, Any]) -> None:
    error = runs["failed"]
    assert isinstance(error, CaptionsFailedError) and isinstance(error, UserError)  # exit code 2, no traceback
    assert runs["down_posts"] == CLIPS  # retries=0: one request per clip
    assert f"only 0 of {CLIPS} clips captioned, below pipeline.caption.min_captioned_share=0.05" in str(error)
    summaries = [m for m in runs["failed_warnings"] if m.startswith("captions (http):")]
    assert len(summaries) == 1, runs["failed_warnings"]
    assert f"{CLIPS} of {CLIPS} clips failed, 0 captioned" in summaries[0]
    assert f"first reasons: {CLIPS} clip(s) like toyfilm-000000: attempt 1/1: request failed: HTTP 500" in summaries[0]
    assert "overloaded" in summaries[0] and "pipeline.caption.retry_failed" in summaries[0]
    # written before stopping: the shards, the manifest and the report, which a re-run resumes from
    assert runs["failed_manifest"]["counts"]["caption_failed"] == CLIPS
    tally = runs["failed_report"]["captions"]["http"]
    assert (tally["clips"], tally["captioned"], tally["failed"]) == (CLIPS, 0, CLIPS)
    assert runs["failed_report"]["reuse"]["caption_tasks"]["recomputed"] >= 1
    for text in [str(error), *runs["failed_warnings"]]:
        assert PASSWORD not in text and QUERY_KEY not in text


def test_failed_captions_are_asked_again_on_a_re_run(runs: dict[str, Any]) -> None:
    partial = runs["partial"]
    assert runs["flaky_posts"] == CLIPS  # every failed clip asked again
    assert partial["reuse"]["captions_retried"] == CLIPS
    assert partial["reuse"]["clip_tasks"]["recomputed"] == 0  # the clips themselves are reused
    assert partial["counts"]["caption_failed"] == CLIPS - ANSWERED
    # above the minimal share: the run goes on, and still warns
    assert any(f"{CLIPS - ANSWERED} of {CLIPS} clips failed, {ANSWERED} captioned" in m for m in runs["partial_warnings"])

    kept = runs["kept"]  # retry_failed=false: nothing to caption, so not even the probe is sent
    assert runs["idle_requests"] == 0 and kept["reuse"]["captions_retried"] == 0
    assert kept["reuse"]["caption_tasks"]["recomputed"] == 0
    assert kept["counts"]["caption_failed"] == CLIPS - ANSWERED

    healthy = runs["healthy"]  # only the clips still failed are asked; those captioned before are kept
    assert runs["healthy_methods"][0] == PROBE and runs["healthy_posts"] == CLIPS - ANSWERED
    assert healthy["reuse"]["captions_retried"] == CLIPS - ANSWERED
    assert healthy["counts"]["caption_failed"] == 0 and healthy["caption_failed"] == []
    assert healthy["captions"]["http"]["captioned"] == CLIPS


def test_manifests_record_the_command_redacted(runs: dict[str, Any]) -> None:
    expected = recorded_command(runs["argv"])
    assert "http://***@127.0.0.1:" in expected and "?key=***" in expected
    sessions = json.loads((runs["output"] / "sessions.json").read_text())
    for command in (runs["failed_manifest"]["command"], sessions["command"]):
        assert command == expected
        assert PASSWORD not in command and QUERY_KEY not in command


def test_lock_record_holds_the_command_redacted(monkeypatch: pytest.MonkeyPatch) -> None:
    from animegamer.utils.folder_lock import Holder

    monkeypatch.setattr(sys, "argv", ["train.py", f"evaluation.judge.url=https://u:{PASSWORD}@h/v1?key={QUERY_KEY}"])
    assert Holder.me().command == "train.py 'evaluation.judge.url=https://***@h/v1?key=***'"


def test_a_refused_port_is_refused_before_any_work(toy_film: Any, tmp_path: Path) -> None:
    import data_pipeline.captioners.probe  # noqa: F401 - imported before the clock starts
    import data_pipeline.run  # noqa: F401
    from data_pipeline.__main__ import run

    with FakeChatServer([]) as gone:
        url = gone.url
    output = tmp_path / "out"
    cfg = compose_config("pipeline", _overrides(output, toy_film.video_path, url))
    started = time.monotonic()
    with pytest.raises(ConfigError) as refused:
        run(cfg)
    elapsed = time.monotonic() - started
    assert elapsed < 1.0, elapsed
    assert f"pipeline.caption.url={url}: cannot reach {url}/models" in str(refused.value)
    assert "Connection refused" in str(refused.value) and "pipeline.caption.probe=off" in str(refused.value)
    assert not output.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("answer", "probe", "found"), [
    ((401, "invalid key"), "models", "HTTP 401 Unauthorized from http://127.0.0.1:{port}/v1/models: the endpoint "
                                     "refused the credentials"),
    ((404, "no such route"), "models", "the server serves no /models there"),
    ((500, "busy"), "models", None),  # reachable: the clips' requests have their own limits
    ((404, "no such route"), "connect", None),  # connect only: the server accepts connections
])
def test_probe_refuses_what_would_fail_every_clip(answer: tuple, probe: str, found: str | None) -> None:
    with FakeChatServer([], otherwise=answer) as server:
        cfg = CaptionConfig(backend="http", url=f"http://user:{PASSWORD}@127.0.0.1:{server.port}/v1",
                            model_name="m", api_key_env="", probe=probe, probe_timeout_s=2.0)
        problems = probe_problems(cfg)
    assert len(server.requests) == (1 if probe == "models" else 0)
    if found is None:
        assert problems == []
        return
    assert len(problems) == 1 and found.format(port=server.port) in problems[0]
    assert problems[0].startswith(f"pipeline.caption.url=http://***@127.0.0.1:{server.port}/v1: ")
    assert PASSWORD not in problems[0]


def test_probe_connect_mode_refuses_a_closed_port() -> None:
    with FakeChatServer([]) as gone:
        port = gone.port
    cfg = CaptionConfig(backend="http", url=f"http://127.0.0.1:{port}/v1", model_name="m", probe="connect")
    problems = probe_problems(cfg)
    assert len(problems) == 1 and f"cannot connect to 127.0.0.1:{port}" in problems[0]
    assert probe_problems(CaptionConfig(backend="http", url=cfg.url, model_name="m", probe="off")) == []
