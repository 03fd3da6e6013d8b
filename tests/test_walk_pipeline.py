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
