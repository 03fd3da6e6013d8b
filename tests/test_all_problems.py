"""One refusal names every problem: a run with a bad setting, a missing film and a caption file with
several bad lines is refused once, with all of them, before any model is built and before anything is
written, through the pipeline's entry point, the fine-tune (whose stages are checked together before
its pipeline runs) and train.py."""
from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import pytest

from animegamer.config.compose import compose_config
from animegamer.errors import USER_ERROR_EXIT_CODE, exit_on_user_error

TRAINED_SIZE = {"frames": 17, "height": 96, "width": 144, "fps": 8.0}  # the --from exports' clip size
BAD_WIDTH = 100  # not a multiple of the decoder's 16-pixel line alignment
BAD_LINES = (3, 5, 7)
CAPTION_LINES = 7
GOOD_RECORD = {"film": "film", "start": 0.0, "end": 1.0, "character": "Sosuke", "motion": "walk",
               "adverb": "slowly", "environment": "seaside village", "time_of_day": "evening",
               "states": {"SC": 1, "ET": 0, "ST": 1}}


def caption_file(folder: Path) -> Path:
    """A caption import whose lines 3 (not JSON), 5 (a negative end) and 7 (fields missing) are bad."""
    bad = {3: "{not json", 5: json.dumps({**GOOD_RECORD, "end": -1.0}), 7: json.dumps({"film": "film"})}
    lines = [bad.get(n, json.dumps({**GOOD_RECORD, "start": float(n), "end": n + 1.0}))
             for n in range(1, CAPTION_LINES + 1)]
    path = folder / "captions.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def files_under(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*"))


@pytest.fixture(autouse=True)
def root_logging():
    """The entry points set up the root logger on this test's captured stderr: put back what was there."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def refusal(entry, capsys) -> list[str]:
    """The problems ``entry()`` is refused with: exit code 2 and one message (after the log), no traceback."""
    with pytest.raises(SystemExit) as done:
        entry()
    assert done.value.code == USER_ERROR_EXIT_CODE
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.splitlines()
    [start] = [i for i, line in enumerate(lines) if line.startswith("error: ")]
    problems = [line[len("  - "):] for line in lines[start + 1:]]
    assert lines[start] == f"error: {len(problems)} configuration problem(s):"
    return problems


def assert_every_bad_line(problems: list[str], captions: Path) -> None:
    named = [n for n in range(1, CAPTION_LINES + 1) if any(f"{captions}:{n}: " in p for p in problems)]
    assert named == list(BAD_LINES)


# --------------------------------------------------------------------------- python -m data_pipeline
@pytest.mark.parametrize("width", [BAD_WIDTH, None], ids=["bad-width", "good-settings"])
def test_the_pipeline_names_a_bad_setting_a_missing_film_and_every_bad_caption_line_at_once(tmp_path, capsys, width):
    """With a bad setting, the settings' check names the films and caption lines too; without one, the
    pipeline's pre-flight names the caption lines beside the missing film."""
    from data_pipeline.__main__ import run

    captions = caption_file(tmp_path)
    film = tmp_path / "films" / "ep01.mp4"  # never written
    output = tmp_path / "pipeline"
    overrides = ["source=films", f"pipeline.inputs=['{film}']", f"pipeline.caption.path='{captions}'",
                 f"pipeline.output='{output}'", *([f"pipeline.clips.width={width}"] if width else [])]
    before = files_under(tmp_path)
    problems = refusal(lambda: exit_on_user_error(run)(compose_config("pipeline", overrides)), capsys)
    assert problems[0].startswith(f"pipeline.clips size {BAD_WIDTH}x") if width else True
    assert f"pipeline.inputs: {film} does not exist (no file, folder or glob match)" in problems
    assert_every_bad_line(problems, captions)
    assert len(problems) == (1 if width else 0) + 1 + len(BAD_LINES)
    assert files_under(tmp_path) == before  # no output folder, no toy film, nothing else


# --------------------------------------------------------------------------- python -m animegamer.finetune
@pytest.fixture
def start(tmp_path) -> Path:
    """A --from run folder: exports of phases a_joint, b and c trained at :data:`TRAINED_SIZE`."""
    root = tmp_path / "from"
    for phase in ("a_joint", "b", "c"):
        export = root / phase / "export"
        export.mkdir(parents=True)
        (export / "export.json").write_text(json.dumps({
            "config": {"model": {"name": "tiny"}, "phase": {"name": phase, "init_from": ""}},
            "trained_data": {"clip_size": TRAINED_SIZE}, "step": 40, "max_steps": 40}))
        (export / "trained.safetensors").write_bytes(b"")  # the pre-flight reads export.json only
    return root


def finetune_problems(tmp_path, start: Path, monkeypatch, capsys, *overrides: str) -> tuple[list[str], Path, Path]:
    """The fine-tune of a film that does not exist with a caption file with bad lines; returns its refusal's
    problems, the film and the caption file. Nothing under ``tmp_path`` may change."""
    from animegamer import finetune

    captions = caption_file(tmp_path)
    film = tmp_path / "new_film.mp4"  # never written
    argv = ["--film", str(film), "--captions", str(captions), "--from", str(start), "--out", str(tmp_path / "ft"),
            "--steps", "1", "1", "1", *overrides]
    monkeypatch.setattr(sys, "argv", ["animegamer-finetune", *argv])
    before = files_under(tmp_path)
    problems = refusal(finetune.cli, capsys)
    assert files_under(tmp_path) == before  # no --out folder, no pipeline output
    return problems, film, captions


def test_the_finetune_names_the_width_the_missing_film_and_every_bad_caption_line_at_once(tmp_path, start, monkeypatch,
                                                                                          capsys):
    problems, film, captions = finetune_problems(tmp_path, start, monkeypatch, capsys, f"pipeline.clips.width={BAD_WIDTH}")
    size = f"{TRAINED_SIZE['width']}x{TRAINED_SIZE['height']}"
    assert problems[0].startswith(f"pipeline.clips size {BAD_WIDTH}x{TRAINED_SIZE['height']}: width must be a multiple")
    assert f"pipeline.inputs: {film} does not exist (no file, folder or glob match)" in problems
    assert_every_bad_line(problems, captions)
    [trained] = [p for p in problems if "was trained on clips of" in p]
    assert trained.startswith(f"{start / 'a_joint' / 'export'} was trained on clips of 17 frames of {size} at 8 fps")
    assert len(problems) == 1 + 1 + len(BAD_LINES) + 1


def test_the_finetune_checks_every_stage_before_its_pipeline_runs(tmp_path, start, monkeypatch, capsys):
    """A setting every training stage shares is named once with the stages; the evaluation's own settings
    and the pipeline's inputs come in the same message, before the pipeline has written anything."""
    problems, film, captions = finetune_problems(tmp_path, start, monkeypatch, capsys, "phase.lr=-1",
                                                 "evaluation.games=0")
    assert "phase a_joint, b, c: phase.lr=-1.0 must be > 0" in problems
    assert "evaluation: evaluation.games and evaluation.turns must be > 0" in problems
    assert f"pipeline.inputs: {film} does not exist (no file, folder or glob match)" in problems
    assert_every_bad_line(problems, captions)
    assert len(problems) == 2 + 1 + len(BAD_LINES)


# --------------------------------------------------------------------------- train.py
@pytest.mark.parametrize("phase", [["phase=b", "phase.name=c"], ["phase.name=c_typo"]], ids=["other-node", "unknown"])
def test_train_names_two_setting_problems_and_a_missing_data_folder_at_once(tmp_path, capsys, phase):
    """Where the phase's shards cannot be named (the phase node of another phase, an unknown phase), a
    data.root that does not exist is still named beside the settings' problems."""
    from animegamer.phases.run import run  # what train.py runs

    root, out = tmp_path / "no_pipeline_output", tmp_path / "run"
    cfg = compose_config("train", ["model=tiny", *phase, "trainer.accumulate_grad_batches=0", f"data.root='{root}'",
                                   f"output_dir='{out}'"])
    problems = refusal(lambda: exit_on_user_error(run)(cfg), capsys)
    assert problems[0].startswith("phase.name='c")
    assert f"data.root='{root}': no such folder; run the pipeline first (animegamer pipeline ...) or set " \
           f"data.root" in problems
    assert "trainer.accumulate_grad_batches=0 must be >= 1" in problems
    assert len(problems) == 3
    assert list(tmp_path.iterdir()) == []
