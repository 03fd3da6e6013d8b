"""A recipe stage whose shards changed since its checkpoints starts afresh with the earlier run kept; a changed
setting still stops it (the end-to-end case, on real footage, is in test_real_footage_finetune.py)."""
from __future__ import annotations

from pathlib import Path

import pytest

from animegamer import recipe
from animegamer.phases import run as runner
from animegamer.training.run_record import DATA_REASON, Change, RunFolderChanged
from animegamer.utils.folder_lock import LOCK_FILE

SETTING_REASON = "changes what the run computes"


def _stage(tmp_path: Path, monkeypatch, reasons: list[str]) -> tuple[list, Path]:
    """A stage folder with a checkpoint, whose first run is refused for ``reasons``."""
    out = tmp_path / "c"
    (out / "checkpoints").mkdir(parents=True)
    (out / "checkpoints" / "step-0000002.ckpt").write_text("old")
    calls = []

    def run(composed):
        calls.append(sorted(p.name for p in out.iterdir()))
        if len(calls) == 1:
            raise RunFolderChanged(out, out / "run_config.json",
                                   [(Change(f"key{i}", 1, 2), reason) for i, reason in enumerate(reasons)])
        return {"export": str(out / "export")}

    monkeypatch.setattr(runner, "run", run)
    return calls, out


def test_changed_shards_set_the_earlier_run_aside_and_train_afresh(tmp_path, monkeypatch, caplog):
    calls, out = _stage(tmp_path, monkeypatch, [DATA_REASON, DATA_REASON])
    (tmp_path / "c.superseded-1").mkdir()  # an earlier set-aside is not overwritten
    with caplog.at_level("WARNING", logger=recipe.log.name):
        assert recipe.train_stage(["phase=c", f"output_dir={out}"]) == {"export": str(out / "export")}
    # each changed shard folder named once, by its manifest
    assert f"{out}: the shards it trained on changed since its checkpoints (key0, key1); the stage starts" in caplog.text
    assert calls == [["checkpoints"], []]  # the second run found the folder empty
    kept = tmp_path / "c.superseded-2"
    assert (kept / "checkpoints" / "step-0000002.ckpt").read_text() == "old"
    assert not (kept / LOCK_FILE).exists() and not (out / LOCK_FILE).exists()  # held while moving, then released


@pytest.mark.parametrize("reasons", [[SETTING_REASON], [DATA_REASON, SETTING_REASON]])
def test_a_changed_setting_still_stops_the_stage(tmp_path, monkeypatch, reasons):
    calls, out = _stage(tmp_path, monkeypatch, reasons)
    with pytest.raises(RunFolderChanged):
        recipe.train_stage(["phase=c", f"output_dir={out}"])
    assert len(calls) == 1 and (out / "checkpoints" / "step-0000002.ckpt").exists()
    assert not list(tmp_path.glob("c.superseded-*"))


def test_an_evaluation_that_played_no_turn_is_an_error_in_the_log(caplog):
    """A briefly trained MLLM can write every state outside the layout: the run still ends (its report
    and game say so), but the log says it as an error, with the two ways on."""
    with caplog.at_level("ERROR", logger=recipe.log.name):
        assert recipe.say_if_nothing_played({"games": {"planned_turns": 7, "completed_turns": 0}})
    assert "no turn of 7 was played" in caplog.text and "model.mllm.constrained_states=true" in caplog.text
    assert not recipe.say_if_nothing_played({"games": {"planned_turns": 7, "completed_turns": 1}})
    assert not recipe.say_if_nothing_played({})  # an evaluation that planned nothing says so itself
