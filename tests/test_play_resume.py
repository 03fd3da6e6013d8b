"""`animegamer play` stopped halfway (Ctrl-C, a crash) and run again: the game goes on after the turns it
played, to the game an uninterrupted run plays; and the instruction files and manifests a user hands it
that it could not play are refused before any model is built (exit code 2, one message each)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import test_play_user_errors as user_errors

from animegamer.errors import INTERRUPTED_EXIT_CODE, USER_ERROR_EXIT_CODE
from animegamer.game import writer as game_writer
from animegamer.game.cli import main

# The tiny exports, manifest and instruction file, and the refusal checker, of the play command's other tests.
exports, refused = user_errors.exports, user_errors.refused
command, INSTRUCTIONS = user_errors.command, user_errors.INSTRUCTIONS
PLAY = ("--device", "cpu", "--constrained-states", "--sampling-steps", "2", "--window-turns", "3")
SCRIPT = [*INSTRUCTIONS, "Character: Qiqi; Motion: wave; Background: a field."]


def _script(exports: Path, lines: list[str], name: str = "three.txt") -> Path:
    path = exports.parent / f"{exports.name}-{name}"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _argv(exports: Path, out: Path, script: Path, *options: str) -> list[str]:
    argv = command(exports, out, *PLAY, *options)
    argv[argv.index("--instructions") + 1] = str(script)
    return argv


def _without_timings(record: dict) -> dict:
    turns = [{k: v for k, v in t.items() if k != "timings"} for t in record["turns"]]
    return {**{k: v for k, v in record.items() if k not in ("seconds_per_turn", "turns")}, "turns": turns}


def test_a_game_stopped_halfway_resumes_to_the_uninterrupted_game(exports, tmp_path, monkeypatch):
    script = _script(exports, SCRIPT)
    assert main(_argv(exports, tmp_path / "whole", script)) == 0

    add = game_writer.GameWriter.add

    def stopped_after_one_turn(self, result):
        written = add(self, result)
        if len(self.turns) == 1:
            raise KeyboardInterrupt  # Ctrl-C as the second turn starts
        return written

    monkeypatch.setattr(game_writer.GameWriter, "add", stopped_after_one_turn)
    with pytest.raises(SystemExit) as stopped:
        main(_argv(exports, tmp_path / "cut", script))
    assert stopped.value.code == INTERRUPTED_EXIT_CODE
    cut = json.loads((tmp_path / "cut" / "game.json").read_text())
    assert cut["finished"] is False and len(cut["turns"]) == 1
    assert "the same command resumes it" in (tmp_path / "cut" / "index.html").read_text()
    monkeypatch.undo()

    assert main(_argv(exports, tmp_path / "cut", script)) == 0  # the same command again
    whole = json.loads((tmp_path / "whole" / "game.json").read_text())
    resumed = json.loads((tmp_path / "cut" / "game.json").read_text())
    assert resumed["finished"] is True and _without_timings(resumed) == _without_timings(whole)
    for turn in whole["turns"]:  # the same clips, and the representations the history carried
        clip = turn["video"]
        assert (tmp_path / "cut" / clip).read_bytes() == (tmp_path / "whole" / clip).read_bytes()
        rep = game_writer.rep_path(Path(clip)).name
        assert (tmp_path / "cut" / rep).read_bytes() == (tmp_path / "whole" / rep).read_bytes()

    # finished: the same command now refuses, as it did before games could resume
    with pytest.raises(SystemExit) as again:
        main(_argv(exports, tmp_path / "cut", script))
    assert again.value.code == USER_ERROR_EXIT_CODE


def test_a_resume_with_other_instructions_or_settings_is_refused(exports, tmp_path, monkeypatch, capfd):
    script = _script(exports, SCRIPT, "resume.txt")
    out = tmp_path / "cut"
    add = game_writer.GameWriter.add

    def stopped(self, result):
        add(self, result)
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(game_writer.GameWriter, "add", stopped)
        with pytest.raises(SystemExit):
            main(_argv(exports, out, script))
    other = _script(exports, ["Character: Qiqi; Motion: jump; Background: town.", *SCRIPT[1:]], "other.txt")
    with monkeypatch.context() as patch:  # refused before any model is built
        patch.setattr("animegamer.game.cli.load_game_models", lambda *a, **k: pytest.fail("models loaded"))
        capfd.readouterr()
        with pytest.raises(SystemExit) as instructions:
            main(_argv(exports, out, other))
    assert instructions.value.code == USER_ERROR_EXIT_CODE
    assert f"--out {out} holds an unfinished game whose turn 0 was {SCRIPT[0]!r}" in capfd.readouterr().err
    with pytest.raises(SystemExit) as settings:  # another seed: known once the models are built
        main(_argv(exports, out, script, "--seed", "7"))
    assert settings.value.code == USER_ERROR_EXIT_CODE
    capfd.readouterr()
    constrained = "--constrained-states" in _argv(exports, out, script)
    with pytest.raises(SystemExit) as decoding:  # the states decoded another way
        main([a for a in _argv(exports, out, script) if a != "--constrained-states"] if constrained else
             _argv(exports, out, script, "--constrained-states"))
    assert decoding.value.code == USER_ERROR_EXIT_CODE
    assert f"constrained_states: {constrained!r} -> {not constrained!r}" in capfd.readouterr().err
    assert len(json.loads((out / "game.json").read_text())["turns"]) == 1  # kept for its own command


@pytest.mark.parametrize("content, message", [
    ("Character: Qiqi; Motion: run; Background: caf\xe9.\n".encode("latin-1"), "not UTF-8 text (byte 45: invalid continuation byte)"),
    (b"\xff\xfe\x00\x01binary", "not UTF-8 text"),
    ("Character: Qiqi; Motion: run.\nsay <ML><SC></SC> now\n".encode(), "instruction 2 'say <ML><SC></SC> now': it "
     "contains reserved tokens"),
    (("Character: Qiqi; Motion: run " + "and run " * 5000 + "\n").encode(), "above the MLLM's sliding window"),
])
def test_instructions_the_game_could_not_play_are_refused_before_loading(exports, tmp_path, refused, content,
                                                                          message):
    script = exports.parent / f"{exports.name}-bad.txt"
    script.write_bytes(content)
    err = refused(_argv(exports, tmp_path / "g", script))
    assert message in err and str(script) in err and len(err) < 1000
    assert not (tmp_path / "g" / "game.json").exists()


def test_a_window_the_prompt_cannot_hold_is_refused_before_loading(exports, tmp_path, refused):
    long = "Character: Qiqi; Motion: run " + "and run " * 600  # one turn fits, several do not
    script = _script(exports, [long] * 4, "window.txt")
    argv = _argv(exports, tmp_path / "g", script)
    argv[argv.index("--window-turns") + 1] = "4"
    err = refused(argv)
    assert "or play with a smaller --window-turns" in err


def test_a_byte_order_mark_is_not_part_of_the_first_instruction(exports, tmp_path, monkeypatch):
    from animegamer.game.instructions import read_instructions

    path = tmp_path / "notepad.txt"
    path.write_bytes("\ufeffCharacter: Qiqi; Motion: run.\n# a note\n\n".encode("utf-8"))
    assert read_instructions(path) == ["Character: Qiqi; Motion: run."]


def test_a_folder_a_manifest_that_is_not_json_and_a_missing_checkpoint_are_refused(exports, tmp_path, refused):
    argv = command(exports, tmp_path / "g", *PLAY)
    folder = list(argv)
    folder[folder.index("--instructions") + 1] = str(tmp_path)
    assert "a folder, not an instruction file" in refused(folder)
    not_json = tmp_path / "manifest.json"
    not_json.write_text("these are my notes")
    manifest = list(argv)
    manifest[manifest.index("--clips-manifest") + 1] = str(not_json)
    assert f"{not_json}: not a manifest (not JSON" in refused(manifest)
    err = refused([*argv, "model.mllm.official_checkpoint=/nope/mllm.bin"])
    assert "model.mllm.official_checkpoint=/nope/mllm.bin: no such file or folder" in err


def test_a_second_game_command_into_the_same_folder_is_refused_while_the_first_plays(exports, tmp_path, refused):
    from animegamer.utils.folder_lock import LOCK_FILE, folder_lock

    out = tmp_path / "g"
    with folder_lock(out, 0):  # the first command, still playing
        err = refused(command(exports, out, *PLAY))
    assert f"{out} is in use by another run" in err and f"delete {out / LOCK_FILE}" in err
    assert not (out / "game.json").exists()
