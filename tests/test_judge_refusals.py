"""``animegamer judge`` refusals: a judging that scores no game fails with the reason and leaves the folder as
it was (an earlier judge record or none), and bad arguments are named all at once, before anything is asked."""
from __future__ import annotations

import json

import pytest
from http_fakes import PROXY_VARIABLES, FakeChatServer
from test_judge import report_games

from animegamer.config.schema import JudgeConfig
from animegamer.evaluation.judge import JudgeFailed, judge_folder, main
from animegamer.evaluation.report import write_report

FILES = ("metrics.json", "report.md")


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    """urllib honours proxy variables; the closed local endpoint must be tried directly."""
    for var in PROXY_VARIABLES:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")


def never_judged(folder):
    """An evaluation folder as `animegamer eval` leaves it without a judge: metrics.json holds no judge record."""
    write_report(folder, {"clip_i": 0.5}, report_games(folder, ("g1", "g2")))
    assert "judge" not in json.loads((folder / "metrics.json").read_text())["metrics"]
    return folder


def down_url() -> str:
    with FakeChatServer([]) as server:
        return server.url  # nothing listens there once the server is closed


def test_a_never_judged_folder_whose_judge_scores_nothing_fails_and_is_left_as_it_was(tmp_path, capsys):
    folder = never_judged(tmp_path / "eval")
    kept = {name: (folder / name).read_bytes() for name in FILES}
    with pytest.raises(SystemExit) as exit_info:
        main([str(folder), f"evaluation.judge.url={down_url()}", "evaluation.judge.model_name=x",
              "evaluation.judge.samples=1", "evaluation.judge.retries=0"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "Traceback" not in err, err
    assert f"{folder}: the judge scored no game (no game scored: attempt 1/1" in err, err
    assert "metrics.json and report.md unchanged" in err and "earlier judge record" not in err
    assert {name: (folder / name).read_bytes() for name in FILES} == kept


def test_a_folder_without_a_game_to_judge_fails_and_is_left_as_it_was(tmp_path):
    folder = tmp_path / "eval"
    write_report(folder, {"clip_i": 0.5}, [])
    kept = {name: (folder / name).read_bytes() for name in FILES}
    with pytest.raises(JudgeFailed, match="the judge scored no game \\(no game was played\\)"):
        judge_folder(folder, JudgeConfig(url="http://127.0.0.1:9/v1", model_name="x"))
    assert {name: (folder / name).read_bytes() for name in FILES} == kept


def test_an_empty_url_and_model_name_are_both_named(tmp_path, capsys):
    folder = never_judged(tmp_path / "eval")
    with pytest.raises(SystemExit) as exit_info:
        main([str(folder)])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "2 configuration problem(s)" in err, err
    assert "evaluation.judge.url is empty" in err and "evaluation.judge.model_name is empty" in err


def test_placeholder_arguments_name_the_bad_url_and_the_missing_folder_at_once(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        main(["EVAL_FOLDER", "evaluation.judge.url=URL", "evaluation.judge.model_name=NAME"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "Traceback" not in err and "2 configuration problem(s)" in err, err
    assert "evaluation.judge.url='URL': must be an http(s) base URL" in err
    assert "EVAL_FOLDER/metrics.json: missing; pass a folder written by animegamer eval" in err
    assert not (tmp_path / "EVAL_FOLDER").exists()


def test_a_damaged_folder_is_named_beside_the_settings(tmp_path, capsys):
    (tmp_path / "metrics.json").write_text("[]")
    with pytest.raises(SystemExit) as exit_info:
        main([str(tmp_path), "evaluation.judge.url=http://127.0.0.1:9/v1"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "2 configuration problem(s)" in err, err
    assert "evaluation.judge.model_name is empty" in err and f"{tmp_path / 'metrics.json'}: not an evaluation" in err
    assert (tmp_path / "metrics.json").read_text() == "[]"
