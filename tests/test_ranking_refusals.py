"""``animegamer rank``'s refusals of its options: a port out of range or taken, or a timeout that is no
number of seconds, is named (option and key) with exit code 2 before the ``--out`` folder is made; and the
command names itself and the folders it takes as a user types them."""
from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest
from test_ranking_games_and_ranges import five, write_run

from animegamer.ranking.app import REPORT_FILE, RESULTS_FILE, SESSION_FILE
from animegamer.ranking.cli import main
from animegamer.ranking.server import RankingServer


@pytest.fixture(autouse=True)
def _never_served(monkeypatch: pytest.MonkeyPatch) -> None:
    """A command that got as far as serving fails its test instead of serving until it is stopped."""
    def serve_forever(self: RankingServer, *args: object) -> None:
        raise AssertionError("the page was about to be served")

    monkeypatch.setattr(RankingServer, "serve_forever", serve_forever)


@pytest.fixture
def two_runs(tmp_path) -> list[str]:
    return [str(write_run(tmp_path / name, {"g1": five()})) for name in ("alpha", "beta")]


def refused(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("port", ["99999", "-1", "65536"])
def test_a_port_out_of_range_is_named_before_anything_is_written(two_runs, tmp_path, capsys, port):
    out = tmp_path / "rankings"
    err = refused(["--runs", *two_runs, "--out", str(out), "--port", port], capsys)
    assert f"--port {port} (ranking.port): a port is 0 to 65535" in err
    assert not out.exists()


@pytest.mark.parametrize("timeout", ["-5", "0", "nan", "inf"])
def test_a_request_timeout_that_is_no_number_of_seconds_is_named_before_anything_is_written(two_runs, tmp_path,
                                                                                            capsys, timeout):
    out = tmp_path / "rankings"
    err = refused(["--runs", *two_runs, "--out", str(out), "--port", "0", "--request-timeout", timeout], capsys)
    assert f"--request-timeout {timeout} (ranking.request_timeout_s): a finite number of seconds > 0" in err
    assert not out.exists()


def test_every_bad_option_is_named_at_once(two_runs, tmp_path, capsys):
    out = tmp_path / "rankings"
    err = refused(["--runs", *two_runs, "--out", str(out), "--port", "70000", "--request-timeout", "-1"], capsys)
    assert "2 problems" in err and "--port 70000" in err and "--request-timeout -1" in err
    assert not out.exists()


def test_a_port_in_use_is_refused_before_the_folder_is_made(two_runs, tmp_path, capsys):
    out = tmp_path / "rankings"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        err = refused(["--runs", *two_runs, "--out", str(out), "--port", str(port)], capsys)
    assert f"--port {port} (ranking.port): cannot serve on 127.0.0.1:{port}" in err
    assert not out.exists()


def test_a_taken_port_leaves_a_folder_of_other_runs_as_it_was(two_runs, tmp_path, capsys):
    """The folder's session record is not written either: it would tie the folder to these runs."""
    out = tmp_path / "rankings"
    out.mkdir()
    (out / "notes.txt").write_text("kept")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        refused(["--runs", *two_runs, "--out", str(out), "--port", str(taken.getsockname()[1])], capsys)
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


def test_the_bad_server_options_do_not_stop_a_report_only_run(two_runs, tmp_path):
    out = tmp_path / "rankings"
    assert main(["--runs", *two_runs, "--out", str(out), "--port", "99999", "--report-only"]) == 0
    assert all((out / name).is_file() for name in (SESSION_FILE, REPORT_FILE, RESULTS_FILE))


def test_the_server_is_bound_then_given_the_folder_and_closed_on_ctrl_c(two_runs, tmp_path, monkeypatch):
    out = tmp_path / "rankings"
    served = {}

    def serve_forever(self: RankingServer, *args: object) -> None:
        served.update(out=self.app.out, page=self.app.page("alice", 0, "nonce"), server=self)
        raise KeyboardInterrupt

    monkeypatch.setattr(RankingServer, "serve_forever", serve_forever)
    assert main(["--runs", *two_runs, "--out", str(out), "--port", "0"]) == 0
    assert served["out"] == out and five()[0] in served["page"]
    assert served["server"].socket.fileno() == -1  # closed
    assert all((out / name).is_file() for name in (SESSION_FILE, REPORT_FILE, RESULTS_FILE))


def test_usage_errors_name_the_command_as_typed(two_runs, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["animegamer rank"])  # what the animegamer dispatcher sets
    with pytest.raises(SystemExit) as exit_info:
        main(["--runs", *two_runs])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "animegamer rank: error:" in err and "python -m" not in err, err


def test_a_folder_that_is_no_evaluation_names_the_command_that_writes_one(two_runs, tmp_path, capsys):
    err = refused(["--runs", two_runs[0], str(tmp_path / "nothing"), "--out", str(tmp_path / "rankings")], capsys)
    assert f"{Path(tmp_path / 'nothing' / 'metrics.json')}: missing; --runs takes folders written by animegamer " \
           "eval" in err
    assert not (tmp_path / "rankings").exists()
