"""The pipeline's command as a user stops it: Ctrl-C (SIGINT) mid-run ends with one line saying that what
was written is kept and how to resume, and the shell's code for an interrupted command, not a traceback."""
from __future__ import annotations

import logging

import data_pipeline.__main__ as pipeline_main
from animegamer.config.compose import compose_config


def test_ctrl_c_stops_the_pipeline_with_a_line_not_a_traceback(tmp_path, monkeypatch, caplog):
    def interrupted(cfg):
        raise KeyboardInterrupt

    monkeypatch.setattr(pipeline_main, "run", interrupted)
    cfg = compose_config("pipeline", [f"pipeline.output={tmp_path / 'out'}"])
    caught = None
    with caplog.at_level(logging.WARNING, logger="data_pipeline"):
        try:
            pipeline_main.run_and_report(cfg)
        except BaseException as error:  # noqa: BLE001 - a KeyboardInterrupt here must fail the test, not stop pytest
            caught = error
    assert isinstance(caught, SystemExit) and caught.code == pipeline_main.INTERRUPTED_EXIT_CODE == 130
    assert f"interrupted: what is written under {tmp_path / 'out'} is kept" in caplog.text
    assert "run the same command again to resume" in caplog.text


def _ctrl_c_ignored(answers) -> None:
    import signal

    answers.put(signal.getsignal(signal.SIGINT) is signal.SIG_IGN)


def test_a_worker_ignores_ctrl_c_until_it_has_its_own_handler():
    """A worker still importing when Ctrl-C comes would print a traceback; started inside the pool's window it
    ignores it (and the parent ends it), and the parent's own handler is back afterwards."""
    import multiprocessing
    import signal

    from data_pipeline.run import _ctrl_c_ignored_by_new_workers

    context = multiprocessing.get_context("spawn")
    answers = context.Queue()
    before = signal.getsignal(signal.SIGINT)
    for ignoring in (True, False):
        if ignoring:
            with _ctrl_c_ignored_by_new_workers():
                worker = context.Process(target=_ctrl_c_ignored, args=(answers,))
                worker.start()
        else:
            worker = context.Process(target=_ctrl_c_ignored, args=(answers,))
            worker.start()
        worker.join(60)
        assert answers.get(timeout=5) is ignoring
        assert signal.getsignal(signal.SIGINT) == before


def test_ctrl_c_ends_a_pipeline_worker_without_a_traceback_of_its_own():
    """A terminal's Ctrl-C reaches every process of the run: a worker ends at once with the shell's code for
    an interrupted command and prints nothing; the parent's one line says what is kept."""
    import signal
    import subprocess
    import sys

    from animegamer.errors import INTERRUPTED_EXIT_CODE

    worker = subprocess.Popen(
        [sys.executable, "-c", "from data_pipeline.run import start_worker; start_worker('INFO'); import time; "
                               "print('ready', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert worker.stdout.readline().strip() == "ready"
        worker.send_signal(signal.SIGINT)
        _, err = worker.communicate(timeout=30)
    finally:
        worker.kill()
    assert worker.returncode == INTERRUPTED_EXIT_CODE == 130
    assert "Traceback" not in err and "KeyboardInterrupt" not in err


def test_a_broken_link_among_the_films_is_named_not_skipped_silently(tmp_path, caplog):
    from data_pipeline.ingest import find_inputs

    films = tmp_path / "films"
    films.mkdir()
    (films / "kept.mp4").write_bytes(b"not probed here")
    (films / "gone.mp4").symlink_to(tmp_path / "moved" / "gone.mp4")
    (films / "notes.txt").symlink_to(tmp_path / "nowhere.txt")  # not a video: not the pipeline's business
    with caplog.at_level(logging.WARNING, logger="data_pipeline.ingest"):
        assert find_inputs([str(films)], [".mp4"]) == [(films / "kept.mp4").resolve()]
    assert f"{films / 'gone.mp4'}: a link to {tmp_path / 'moved' / 'gone.mp4'}, which does not exist" in caplog.text
    assert "notes.txt" not in caplog.text


def test_a_broken_link_is_a_skipped_input_of_the_report(tmp_path):
    from data_pipeline.ingest import BROKEN_LINK, broken_links

    films = tmp_path / "films"
    (films / "more").mkdir(parents=True)
    (films / "kept.mp4").write_bytes(b"not probed here")
    (films / "more" / "gone.MP4").symlink_to(tmp_path / "moved.mp4")
    (films / "notes.txt").symlink_to(tmp_path / "nowhere.txt")
    [broken] = broken_links([str(films), str(films / "kept.mp4")], [".mp4"])
    assert broken.to_json() == {"path": str(films / "more" / "gone.MP4"), "reason": BROKEN_LINK,
                                "detail": f"a link to {tmp_path / 'moved.mp4'}, which does not exist"}
