"""`animegamer play` and `animegamer inspect` on a new user's mistakes: a missing export, an --out that is a
file, a device torch does not see, a zero or negative count, the usage line's command name, and inspecting
the game.json a played game wrote. A refusal is one message, exit code 2, before any model is built."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Sequence

import pytest
import torch
from omegaconf import OmegaConf

from animegamer.config.compose import compose_config
from animegamer.config.validate import ConfigError
from animegamer.errors import USER_ERROR_EXIT_CODE, OutputExistsError, is_user_error
from animegamer.game.cli import build_parser, main
from animegamer.game.models import load_game_models
from animegamer.config.validate import device_problems
from animegamer.game.writer import GameWriter

SMALL = ["model=tiny", "pipeline.clips.height=32", "pipeline.clips.width=48"]
LEVEL_FLOW = {1: 0.25, 2: 1.5, 3: 4.0, 4: 12.0, 5: 30.0}
INSTRUCTIONS = ["Character: Qiqi; Motion: run; Background: town.",
                "Character: Qiqi; Motion: sit down; Background: town at night."]


def tiny_cfg():
    return OmegaConf.to_object(compose_config("train", SMALL))


@pytest.fixture(scope="module")
def exports(tmp_path_factory) -> Path:
    return write_tiny_game_inputs(tmp_path_factory.mktemp("exports"))


def write_tiny_game_inputs(root: Path, instructions: Sequence[str] = INSTRUCTIONS) -> Path:
    """Random tiny phase (b) and (a) exports, a clips manifest and an instruction file, in ``root``."""
    from animegamer.checkpoints.export import save_export
    from animegamer.data.words import training_word_tokenizer
    from animegamer.models.game_mllm import build_game_mllm
    from animegamer.models.reconstruction import ReconstructionModel

    cfg = tiny_cfg()
    torch.manual_seed(0)
    save_export(root / "b", build_game_mllm(cfg, [], words=training_word_tokenizer).model, {"phase": "b"})
    renderer = ReconstructionModel(cfg)
    renderer.decoder.add_lora()
    save_export(root / "a", renderer, {"phase": "a_joint"})
    (root / "manifest.json").write_text(json.dumps({"kind": "clips", "motion_bins": {
        "edges": [0.5, 2.5, 10, 20], "level_flow": {str(k): v for k, v in LEVEL_FLOW.items()}}}))
    (root / "turns.txt").write_text("\n".join(instructions) + "\n")
    return root


def command(exports: Path, out: Path, *options: str, mllm: bool = True, renderer: bool = True) -> list[str]:
    argv = ["--clips-manifest", str(exports / "manifest.json"), "--instructions", str(exports / "turns.txt"),
            "--out", str(out), *options, *SMALL]
    argv += ["--mllm", str(exports / "b")] if mllm else []
    return argv + (["--renderer", str(exports / "a")] if renderer else [])


@pytest.fixture
def refused(monkeypatch, capfd):
    """``refused(argv)``: play's stderr, once it exited with code 2 before building any model."""

    def never_loaded(*args, **kwargs):
        raise AssertionError("the models were loaded before the refusal")

    monkeypatch.setattr("animegamer.game.cli.load_game_models", never_loaded)

    def run(argv: list[str]) -> str:
        capfd.readouterr()
        with pytest.raises(SystemExit) as stopped:
            main(argv)
        err = capfd.readouterr().err
        assert stopped.value.code == USER_ERROR_EXIT_CODE and "Traceback" not in err, err
        return err

    return run


# --------------------------------------------------------------------------- missing weights
def test_play_without_an_mllm_or_a_renderer_export_is_refused_before_loading(exports, tmp_path, refused):
    err = refused(command(exports, tmp_path / "g", "--device", "cpu", mllm=False))
    assert "--mllm: no MLLM weights; give a phase (b) export folder" in err and "--renderer" not in err
    err = refused(command(exports, tmp_path / "g", "--device", "cpu", renderer=False))
    assert "--renderer: no renderer weights; give a phase (c) or (a) export folder" in err
    assert not (tmp_path / "g").exists()


def test_loading_without_weights_is_a_user_error_before_anything_is_built(monkeypatch):
    monkeypatch.setattr("animegamer.game.models.load_game_mllm", lambda *a, **k: pytest.fail("built the MLLM"))
    with pytest.raises(ConfigError) as refusal:
        load_game_models(tiny_cfg(), "", [], LEVEL_FLOW, device="cpu")
    assert is_user_error(refusal.value) and isinstance(refusal.value, ValueError)
    assert "no MLLM weights" in str(refusal.value) and "no renderer weights" in str(refusal.value)


# --------------------------------------------------------------------------- --out
def test_an_out_that_is_a_file_is_refused_and_kept(exports, tmp_path, refused):
    taken = tmp_path / "notes.txt"
    taken.write_text("mine")
    err = refused(command(exports, taken, "--device", "cpu"))
    assert f"--out {taken} is a file, not a folder" in err
    err = refused(command(exports, taken / "game", "--device", "cpu"))
    assert f"--out {taken / 'game'}: {taken} is a file, not a folder" in err
    assert taken.read_text() == "mine"


def test_the_writer_refuses_a_file_as_its_folder(tmp_path):
    taken = tmp_path / "notes.txt"
    taken.write_text("mine")
    with pytest.raises(OutputExistsError, match="is a file, not a folder"):
        GameWriter(None, taken)
    assert taken.read_text() == "mine"


# --------------------------------------------------------------------------- --device
def test_a_cuda_device_without_cuda_is_refused_before_loading(exports, tmp_path, refused, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    err = refused(command(exports, tmp_path / "g", "--device", "cuda"))
    assert "--device cuda needs a CUDA GPU, and torch sees none on this machine" in err
    assert "--device cpu" in err
    err = refused(command(exports, tmp_path / "g", "--device", "gpu"))
    assert "--device gpu: not a device torch knows" in err
    assert not (tmp_path / "g").exists()


def test_device_problems(monkeypatch):
    def problems(device):
        return device_problems(device, f"--device {device}", "--device cpu")

    assert problems(None) == problems("cpu") == []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert problems("cuda") == ["--device cuda needs a CUDA GPU, and torch sees none on this machine: run on the "
                                "CPU with --device cpu"]
    assert problems("gpu") == ["--device gpu: not a device torch knows (cuda, cuda:N or cpu)"]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert problems("cuda") == problems("cuda:0") == []
    assert "torch sees 1 CUDA device(s)" in problems("cuda:1")[0]


# --------------------------------------------------------------------------- counts
@pytest.mark.parametrize("option, value, message", [
    ("--sampling-steps", "0", "--sampling-steps 0: must be >= 1"),
    ("--sampling-steps", "-3", "--sampling-steps -3: must be >= 1"),
    ("--window-turns", "0", "--window-turns 0: must be >= 1"),
    ("--window-turns", "-1", "--window-turns -1: must be >= 1"),
    ("--max-turns", "-1", "--max-turns -1: must be >= 0"),
])
def test_a_zero_or_negative_count_is_refused_not_replaced(exports, tmp_path, refused, option, value, message):
    err = refused(command(exports, tmp_path / "g", "--device", "cpu", option, value))
    assert message in err


# --------------------------------------------------------------------------- the command's name
def test_the_usage_line_names_the_command_as_typed(monkeypatch, capsys):
    from animegamer.cli import main as animegamer

    monkeypatch.setattr(sys, "argv", ["animegamer"])
    with pytest.raises(SystemExit) as stopped:
        animegamer(["play", "--no-such-option"])
    err = capsys.readouterr().err
    assert stopped.value.code == USER_ERROR_EXIT_CODE
    assert err.startswith("usage: animegamer play ") and "\nanimegamer play: error: " in err
    monkeypatch.setattr(sys, "argv", [str(Path(main.__code__.co_filename).with_name("__main__.py"))])
    assert build_parser().prog == "python -m animegamer.game"


def test_python_m_animegamer_game_keeps_its_name():
    ran = subprocess.run([sys.executable, "-m", "animegamer.game", "--no-such-option"], capture_output=True,
                         text=True, timeout=300)
    assert ran.returncode == USER_ERROR_EXIT_CODE
    assert "usage: python -m animegamer.game " in ran.stderr and "python -m animegamer.game: error: " in ran.stderr


# --------------------------------------------------------------------------- a played game, then inspected
@pytest.fixture(scope="module")
def played(exports, tmp_path_factory) -> Path:
    """Two turns of the random tiny MLLM, its states decoded within the layout so they parse."""
    out = tmp_path_factory.mktemp("played") / "game"
    assert main(command(exports, out, "--device", "cpu", "--constrained-states", "--sampling-steps", "2",
                        "--window-turns", "2")) == 0
    return out / "game.json"


def test_given_counts_are_played_as_given(played):
    record = json.loads(played.read_text())
    assert record["sampling"]["steps"] == 2 and record["window_turns"] == 2
    assert [t["instruction"] for t in record["turns"]] == INSTRUCTIONS


def test_inspect_reads_the_game_json_play_wrote(played, monkeypatch, capsys):
    """Every turn but the last is history; the last one's generated states are the labels."""
    from animegamer.cli import main as animegamer

    monkeypatch.setattr(sys, "argv", ["animegamer"])
    inspect = ["inspect", str(played), "--query-tokens", "3", "model=tiny"]
    assert animegamer(inspect) == 0
    described = json.loads(capsys.readouterr().out)
    last = json.loads(played.read_text())["turns"][-1]["predicted"]
    assert described["num_history"] == 1 and described["label_tokens"][0] == f"<Strength_{last['ML']}>"
    assert animegamer([*inspect, "--prompt"]) == 0
    assert json.loads(capsys.readouterr().out)["tokens"][-1] == "<ML>"


@pytest.mark.parametrize("turn, message", [
    ({"instruction": "run"}, "turn 0 lacks its 'instruction' or its states"),
    ({"instruction": "run", "states": {"ML": 9, "SC": 0, "ET": 0, "ST": 0}}, "turn 0: state ML must be in [1, 5]"),
    ({"instruction": "run", "predicted": [1, 2]}, "turn 0: "),
])
def test_inspect_names_the_file_and_the_turn_it_cannot_read(tmp_path, capsys, turn, message):
    from animegamer.cli.inspect import main as inspect

    game = tmp_path / "game.json"
    game.write_text(json.dumps({"turns": [turn]}))
    with pytest.raises(SystemExit) as stopped:
        inspect([str(game), "--query-tokens", "3", "model=tiny"])
    err = capsys.readouterr().err
    assert stopped.value.code == USER_ERROR_EXIT_CODE and "Traceback" not in err
    assert err.startswith(f"error: {game}: {message}"), err
