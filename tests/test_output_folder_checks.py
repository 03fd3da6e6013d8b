"""An output folder that is a file (or sits under one) is refused by the training pre-flight, by name, before
anything is built; a folder that does not exist yet is fine."""
from __future__ import annotations

from pathlib import Path

from phase_a_helpers import tiny_train_cfg

from animegamer.phases.preflight import check_training


def _output_problems(tmp_path: Path, output: Path) -> list[str]:
    composed, _ = tiny_train_cfg(tmp_path / "data", output)
    return [p for p in check_training(composed, data=False) if p.startswith("output_dir=")]


def test_an_output_dir_that_is_a_file_is_refused_by_name(tmp_path: Path) -> None:
    afile = tmp_path / "notes.txt"
    afile.write_text("kept")
    (refused,) = _output_problems(tmp_path, afile)
    assert str(afile) in refused and "is a file, not a folder" in refused
    (under,) = _output_problems(tmp_path, afile / "run")
    assert f"{afile} is a file, not a folder" in under
    assert afile.read_text() == "kept"


def test_a_new_or_existing_output_folder_is_fine(tmp_path: Path) -> None:
    assert _output_problems(tmp_path, tmp_path / "new" / "run") == []
    assert _output_problems(tmp_path, tmp_path) == []
