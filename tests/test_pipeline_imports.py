"""What the pipeline's modules load when imported: its clip workers start without torch, and its command
(``python -m data_pipeline``, ``animegamer pipeline``) loads the video decoders only when it decodes."""
from __future__ import annotations

import json
import subprocess
import sys

# Loaded by a shot detection or a toy film's encoding, not by importing the command.
DECODERS = ("av", "scenedetect")


def loaded_after(module: str, candidates: tuple[str, ...]) -> list[str]:
    """Which of ``candidates`` a fresh interpreter holds after importing ``module``."""
    code = (f"import json, sys, {module}\n"
            f"print(json.dumps([name for name in {list(candidates)!r} if name in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return json.loads(out.splitlines()[-1])


def test_clip_workers_start_without_torch():
    # A spawned worker imports data_pipeline.process (plan_film, run_task); the RAFT estimator's weights
    # reader (checkpoints.safe_load) comes with it and must not bring torch to every worker.
    assert loaded_after("data_pipeline.process", ("torch", "numpy")) == ["numpy"]


def test_pipeline_command_loads_no_video_decoder_on_import():
    assert loaded_after("data_pipeline.__main__", (*DECODERS, "data_pipeline.run")) == ["data_pipeline.run"]
