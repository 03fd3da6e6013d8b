"""An evaluation run again with the same config, exports and clips is read back, not played again
(``animegamer.evaluation.reuse``); any change plays it again."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from animegamer.config.compose import compose_config
from animegamer.evaluation.reuse import RECORD_FILE, evaluate_or_reuse


@pytest.fixture
def played(monkeypatch, tmp_path):
    """A stand-in for ``evaluation.run`` that counts its calls and writes what the real one does."""
    calls = []

    def fake_run(composed):
        out = Path(composed.evaluation.out)
        out.mkdir(parents=True, exist_ok=True)
        metrics = {"acc_f": {"available": True, "value": 0.5 + len(calls)}}
        (out / "metrics.json").write_text(json.dumps({"metrics": metrics}))
        calls.append(out)
        return {"metrics": metrics, "files": {"report_md": str(out / "report.md")}, "out": str(out)}

    monkeypatch.setattr("animegamer.evaluation.runner.run", fake_run)
    return calls


def _export(folder: Path, tensors: bytes) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "export.json").write_text(json.dumps({"step": 1}))
    (folder / "trained.safetensors").write_bytes(tensors)
    return str(folder)


def _config(tmp_path: Path, *extra: str):
    mllm, renderer = _export(tmp_path / "b", b"mllm"), str(tmp_path / "c")
    return compose_config("evaluate", [f"evaluation.out={tmp_path / 'eval'}", f"evaluation.mllm_export={mllm}",
                                       f"evaluation.renderer_export={renderer}", *extra])


def test_the_same_evaluation_is_read_back_and_any_change_plays_it_again(played, tmp_path):
    _export(tmp_path / "c", b"renderer")
    first = evaluate_or_reuse(_config(tmp_path))
    again = evaluate_or_reuse(_config(tmp_path))
    assert len(played) == 1 and again == first  # read back: the same metrics, files and folder

    evaluate_or_reuse(_config(tmp_path, "evaluation.turns=3"))  # another setting
    assert len(played) == 2
    _export(tmp_path / "c", b"renderer trained again")  # same path, other tensors
    evaluate_or_reuse(_config(tmp_path, "evaluation.turns=3"))
    assert len(played) == 3
    (tmp_path / "eval" / "metrics.json").unlink()  # metrics gone: nothing to read back
    evaluate_or_reuse(_config(tmp_path, "evaluation.turns=3"))
    assert len(played) == 4


def test_a_replay_cut_short_leaves_no_valid_record(played, tmp_path, monkeypatch):
    _export(tmp_path / "c", b"renderer")
    evaluate_or_reuse(_config(tmp_path))

    def killed(composed):
        raise KeyboardInterrupt

    monkeypatch.setattr("animegamer.evaluation.runner.run", killed)
    with pytest.raises(KeyboardInterrupt):
        evaluate_or_reuse(_config(tmp_path, "evaluation.turns=3"))
    assert not (tmp_path / "eval" / RECORD_FILE).exists()  # the old metrics may be half overwritten


def test_an_evaluation_played_by_evaluate_py_invalidates_the_record(played, tmp_path, monkeypatch):
    """``evaluate.py`` plays into the same folder with other settings (e.g. fewer games): the recipe's
    next run must play again, not read back metrics the record no longer describes."""
    from omegaconf import OmegaConf

    from animegamer.evaluation import runner as evaluation

    _export(tmp_path / "c", b"renderer")
    evaluate_or_reuse(_config(tmp_path))
    assert (tmp_path / "eval" / RECORD_FILE).exists()

    class Played(Exception):
        pass

    def stop(*_):  # where the real evaluation starts playing: the record must be gone by then
        raise Played

    monkeypatch.setattr(evaluation, "held_out_games", stop)
    with pytest.raises(Played):
        evaluation.evaluate(OmegaConf.to_object(_config(tmp_path, "evaluation.games=1")))
    assert not (tmp_path / "eval" / RECORD_FILE).exists()
    evaluate_or_reuse(_config(tmp_path))
    assert len(played) == 2  # played again, not read back
