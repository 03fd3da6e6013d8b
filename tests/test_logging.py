"""One log format, each line once: Lightning's own console handlers do not print a second copy, whichever
is imported first; expected errors of the entry points are one message and exit code 2, no traceback."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest

from conftest import REPO

LOG_LINE = re.compile(r"^\d\d:\d\d:\d\d INFO \[rank0\] (lightning[\w.]*|animegamer[\w.]*): ")

# Each snippet logs through Lightning's loggers (seed_everything, rank_zero_info) and through ours.
LIGHTNING_LINES = """
import logging
import lightning.pytorch as pl
from lightning.pytorch.utilities import rank_zero_info
pl.seed_everything(7)
rank_zero_info("lightning says hello")
logging.getLogger("animegamer.check").info("framework says hello")
"""
SETUP = "from animegamer.utils.logging import setup_logging; setup_logging('INFO')\n"
IMPORT_ORDERS = {"setup_logging first": SETUP + LIGHTNING_LINES,
                 "lightning first": "import lightning\n" + SETUP + LIGHTNING_LINES}


def _python(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def test_every_lightning_line_is_printed_once_in_the_shared_format():
    running = {name: _python(code) for name, code in IMPORT_ORDERS.items()}  # both at once: imports dominate
    for name, process in running.items():
        out, err = process.communicate(timeout=300)
        assert process.returncode == 0, err
        lines = [line for line in (out + err).splitlines() if line.strip()]
        for message in ("Seed set to 7", "lightning says hello", "framework says hello"):
            matching = [line for line in lines if message in line]
            assert len(matching) == 1, (name, message, lines)
            assert LOG_LINE.match(matching[0]), (name, matching[0])


def test_user_errors_print_one_message_and_other_errors_keep_their_traceback(capsys):
    from animegamer.config.validate import ConfigError
    from animegamer.errors import USER_ERROR_EXIT_CODE, MissingInputError, exit_on_user_error

    def refuse(error):
        raise error

    for error in (ConfigError(["model.decoder.width=7 must be a multiple of 8", "data.root: no such folder"]),
                  MissingInputError("outputs/x/export: not an export folder")):
        with pytest.raises(SystemExit) as stopped:
            exit_on_user_error(refuse)(error)
        assert stopped.value.code == USER_ERROR_EXIT_CODE
        assert capsys.readouterr().err == f"error: {error}\n"
    with pytest.raises(RuntimeError, match="a bug"):
        exit_on_user_error(refuse)(RuntimeError("a bug"))
    assert exit_on_user_error(lambda x: x + 1)(1) == 2


# Each entry point with a setting the validation refuses (clip width not a multiple of 16) or a path
# that does not exist: the problem on stderr, exit code 2, no traceback. The quick start is run in
# this process (test below): its main() is the console script itself.
ENTRY_POINTS = {
    "train.py": ([sys.executable, str(REPO / "train.py"), "experiment=quickstart_a",
                  "phase.init_from=/nonexistent/export"],
                 "phase.init_from='/nonexistent/export'"),
    "evaluate.py": ([sys.executable, str(REPO / "evaluate.py"), "experiment=quickstart_eval",
                     "evaluation.mllm_export=/nonexistent/b"], "evaluation.mllm_export='/nonexistent/b'"),
    "python -m data_pipeline": ([sys.executable, "-m", "data_pipeline", "pipeline.clips.width=100"],
                                "width must be a multiple of 16"),
    "python -m animegamer.finetune": ([sys.executable, "-m", "animegamer.finetune", "--film", "f.mp4", "--captions",
                                       "f.jsonl", "--from", "/nonexistent", "--out", "/tmp/never"], "/nonexistent"),
    "python -m animegamer.game": ([sys.executable, "-m", "animegamer.game", "--mllm", "/nonexistent/b", "--renderer",
                                   "/nonexistent/c", "--clips-manifest", "/nonexistent/manifest.json",
                                   "--instructions", "/nonexistent/turns.txt", "--out", "/tmp/never"],
                                  "--mllm /nonexistent/b: not an export folder"),
}


def test_entry_points_print_expected_errors_without_a_traceback(tmp_path):
    """Run from another directory (relative output folders land in tmp_path, not in the repository)."""
    import os

    from animegamer.errors import USER_ERROR_EXIT_CODE

    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    running = {name: subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      env=env)
               for name, (argv, _) in ENTRY_POINTS.items()}  # all at once: start-up (imports) dominates
    for name, process in running.items():
        out, err = process.communicate(timeout=600)
        expected = ENTRY_POINTS[name][1]
        assert process.returncode == USER_ERROR_EXIT_CODE, (name, err[-2000:])
        assert "Traceback" not in out + err and "error: " in err and expected in err, (name, err[-2000:])


def test_quickstart_prints_a_refused_setting_without_a_traceback(tmp_path, monkeypatch, capsys):
    from animegamer.errors import USER_ERROR_EXIT_CODE
    from animegamer.quickstart import main

    monkeypatch.setattr(sys, "argv", ["animegamer-quickstart", f"pipeline.output={tmp_path}/pipeline",
                                      "pipeline.clips.width=100"])
    with pytest.raises(SystemExit) as stopped:
        main()
    err = capsys.readouterr().err
    assert stopped.value.code == USER_ERROR_EXIT_CODE and "width must be a multiple of 16" in err
    assert "Traceback" not in err and not list(tmp_path.iterdir())


def test_torchao_import_notices_are_dropped_and_its_other_warnings_kept():
    """transformers and diffusers import torchao (the fp8 extra) at every start; its notices about kernels the
    framework does not use were six alarming lines in the quick start. Only those are dropped."""
    code = SETUP + """
import logging
import transformers.modeling_utils, diffusers  # noqa: F401  what imports torchao in a run
logging.getLogger("torchao").warning("Failed to load /x/_C_mxfp8.so: Could not load this library")
logging.getLogger("torchao").warning("a torchao warning that matters")
logging.getLogger("torch.utils._pytree").warning("%s is an Enum subclass", "<enum 'X'>")
logging.getLogger("torchao.kernel.intmm").warning("Warning: Detected no triton, on systems without Triton")
logging.getLogger("diffusers.quantizers.torchao.torchao_quantizer").warning(
    "Unable to import `torchao` Tensor objects. This may affect loading checkpoints")
"""
    process = _python(code)
    out, err = process.communicate(timeout=300)
    assert process.returncode == 0, err
    assert "a torchao warning that matters" in out + err
    for notice in ("Failed to load", "Detected no triton", "Unable to import `torchao`", "is an Enum subclass"):
        assert notice not in out + err, (notice, out + err)
