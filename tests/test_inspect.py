"""`animegamer inspect GAME_JSON` against what a played game's MLLM read (its model preset and window, as
game.json records them, unless the command line says otherwise), and on a new user's mistakes: a query count
outside the layout, a tokenizer path that is no tokenizer, the usage line, an empty game. A refusal is one
message naming the option or file and exit code 2, without a traceback."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from test_play_user_errors import SMALL, write_tiny_game_inputs

from animegamer.cli.inspect import main as inspect
from animegamer.errors import USER_ERROR_EXIT_CODE
from animegamer.mllm.tokens import NUM_FRAME_TOKENS

INSTRUCTIONS = ["Character: Qiqi; Motion: run; Background: town.",
                "Character: Qiqi; Motion: sit down; Background: town at night.",
                "Character: Qiqi; Motion: jump; Background: a bridge."]
WINDOW = 2  # the MLLM reads one earlier turn: fewer than the game has before its last turn


def described(capsys, *argv: str) -> dict:
    assert inspect(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def refused(capsys, *argv: str) -> str:
    """The one line a refused command line prints (exit code 2, no traceback)."""
    with pytest.raises(SystemExit) as stopped:
        inspect(list(argv))
    err = capsys.readouterr().err
    assert stopped.value.code == USER_ERROR_EXIT_CODE, err
    assert "Traceback" not in err and len(err.splitlines()) == 1 and err.startswith("error: "), err
    return err.strip()


def write_game(folder: Path, record: dict) -> Path:
    path = folder / "game.json"
    path.write_text(json.dumps(record))
    return path


def turn(instruction: str, ml: int = 1) -> dict:
    return {"instruction": instruction, "predicted": {"ML": ml, "SC": 0, "ET": 1, "ST": -1}}


# --------------------------------------------------------------------------- a played game
@pytest.fixture(scope="module")
def played(tmp_path_factory) -> tuple[Path, list]:
    """A 3-turn game of a random tiny MLLM with a window of 2 turns, and every prompt the game's MLLM read."""
    from animegamer.game.cli import main as play
    from animegamer.mllm import predict

    root = write_tiny_game_inputs(tmp_path_factory.mktemp("inspect_played"), INSTRUCTIONS)
    prompts = []

    def recorded(*args, **kwargs):
        prompts.append(build_prompt(*args, **kwargs))
        return prompts[-1]

    build_prompt = predict.build_prompt
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(predict, "build_prompt", recorded)
        assert play(["--clips-manifest", str(root / "manifest.json"), "--instructions", str(root / "turns.txt"),
                     "--out", str(root / "game"), "--mllm", str(root / "b"), "--renderer", str(root / "a"),
                     "--device", "cpu", "--constrained-states", "--sampling-steps", "2",
                     "--window-turns", str(WINDOW), *SMALL]) == 0
    assert len(prompts) == len(INSTRUCTIONS)
    return root / "game" / "game.json", prompts


def test_the_prompt_shown_is_the_one_the_games_mllm_read(played, capsys):
    """No option: the model preset and the window game.json records, so the last turn's prompt is the very
    sequence the game built for it (its N, its one windowed history turn)."""
    game, prompts = played
    record = json.loads(game.read_text())
    assert record["model"] == "tiny" and record["window_turns"] == WINDOW
    read = prompts[-1]
    shown = described(capsys, str(game), "--prompt")
    assert (shown["model"], shown["model_from"]) == ("tiny", "game file")
    assert (shown["window_turns"], shown["window_turns_from"]) == (WINDOW, "game file")
    assert shown["num_query_tokens"] == read.num_query_tokens
    assert shown["num_history"] == read.num_history == WINDOW - 1
    assert shown["game_turns"] == [len(INSTRUCTIONS) - WINDOW, len(INSTRUCTIONS) - 1]
    assert shown["input_ids"] == read.input_ids
    assert shown["query_mask"] == [int(b) for b in read.query_mask] and shown["history_turn"] == read.history_turn
    # The training sequence is that prompt completed by the last turn's generated states.
    sequence = described(capsys, str(game))
    assert sequence["num_history"] == WINDOW - 1 and sequence["input_ids"][:len(read)] == read.input_ids
    assert sequence["label_tokens"][0] == f"<Strength_{record['turns'][-1]['predicted']['ML']}>"


def test_the_command_line_wins_over_the_game_file(played, capsys):
    game, _ = played
    shown = described(capsys, str(game), "--window-turns", "3", "model=paper")
    assert (shown["model"], shown["model_from"], shown["window_turns_from"]) == ("paper", "command line",
                                                                                  "command line")
    assert shown["num_history"] == 2 and shown["game_turns"] == [0, 1, 2] and shown["num_query_tokens"] == 226
    # a model key alone keeps the game's preset under it
    shown = described(capsys, str(game), "model.encoder.image_tokens=4")
    assert shown["model_from"] == "game file" and shown["num_query_tokens"] == 30 + 4


def test_a_game_file_that_records_no_model_or_window_reads_as_before(tmp_path, capsys):
    game = write_game(tmp_path, {"turns": [turn("run"), turn("jump"), turn("sit")]})
    shown = described(capsys, str(game))
    assert (shown["model"], shown["model_from"], shown["window_turns"], shown["window_turns_from"]) == \
        ("paper", "default", None, "default")
    assert shown["num_history"] == 2 and shown["num_query_tokens"] == 226


@pytest.mark.parametrize("record, message", [
    ({"model": "huge"}, "its model 'huge' is no model preset of animegamer inspect (paper, small, tiny)"),
    ({"window_turns": 0}, "its window_turns must be an integer >= 1"),
    ({"window_turns": "2"}, "its window_turns must be an integer >= 1"),
])
def test_a_game_files_model_or_window_that_cannot_be_read_is_refused(tmp_path, capsys, record, message):
    game = write_game(tmp_path, {**record, "turns": [turn("run")]})
    assert refused(capsys, str(game)).startswith(f"error: {game}: {message}")


# --------------------------------------------------------------------------- the command line's mistakes
@pytest.mark.parametrize("count", ["0", "-3", str(NUM_FRAME_TOKENS + 1)])
def test_a_query_count_outside_the_layout_is_refused_before_any_tokenizer(tmp_path, capsys, monkeypatch, count):
    from animegamer.mllm import inspect as body

    monkeypatch.setattr(body, "load_tokenizer", lambda *a: pytest.fail("a tokenizer was built"))
    game = write_game(tmp_path, {"turns": [turn("run")]})
    assert refused(capsys, str(game), "--query-tokens", count) == \
        f"error: --query-tokens {count}: must be in [1, {NUM_FRAME_TOKENS}] (one <frame_i> token of the layout " \
        "per query)"


def test_a_model_with_more_queries_than_the_layout_holds_is_refused(tmp_path, capsys):
    game = write_game(tmp_path, {"model": "tiny", "turns": [turn("run")]})
    assert refused(capsys, str(game), "model.encoder.image_tokens=300").startswith(
        f"error: model.encoder of model 'tiny' gives 330 representation tokens; the layout holds [1, "
        f"{NUM_FRAME_TOKENS}]")


def test_a_window_below_one_is_refused(tmp_path, capsys):
    game = write_game(tmp_path, {"turns": [turn("run")]})
    assert refused(capsys, str(game), "--window-turns", "0").startswith("error: --window-turns 0: must be >= 1")


def empty_folder(folder: Path) -> Path:
    folder.mkdir()
    return folder


def broken_tokenizer(folder: Path) -> Path:
    """Tokenizer files a loader cannot parse."""
    empty_folder(folder)
    (folder / "tokenizer_config.json").write_text("{}")
    (folder / "tokenizer.json").write_text("{not json")
    return folder


@pytest.mark.parametrize("make, reason", [
    (lambda tmp: tmp / "nope", "no such folder"),
    (lambda tmp: write_game(tmp, {}), "not a folder"),
    (lambda tmp: empty_folder(tmp / "empty"), "the folder holds no tokenizer"),
    (lambda tmp: broken_tokenizer(tmp / "broken"), "no tokenizer loads from this folder"),
])
@pytest.mark.parametrize("option", ["--tokenizer", "model.mllm.tokenizer"])
def test_a_tokenizer_path_that_is_no_tokenizer_is_refused_naming_the_option(tmp_path, capsys, make, reason, option):
    folder = make(tmp_path)
    game = tmp_path / "g.json"
    game.write_text(json.dumps({"model": "tiny", "turns": [turn("run")]}))
    argv = ["--tokenizer", str(folder)] if option == "--tokenizer" else [f"{option}={folder}"]
    where = f"--tokenizer {folder}" if option == "--tokenizer" else f"{option}={folder}"
    assert refused(capsys, str(game), *argv).startswith(f"error: {where}: {reason}")


def test_the_usage_asks_for_the_game_file_alone(capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["animegamer"])
    with pytest.raises(SystemExit) as stopped:
        inspect([])
    err = capsys.readouterr().err
    assert stopped.value.code == USER_ERROR_EXIT_CODE
    assert err.splitlines()[-1] == "animegamer inspect: error: the following arguments are required: game"
    assert "[key=value ...]" in err


@pytest.mark.parametrize("prompt", [False, True])
def test_an_empty_game_shows_zero_turns(tmp_path, capsys, prompt):
    """A game stopped before its first turn has a game.json of no turns: it read nothing."""
    game = write_game(tmp_path, {"model": "tiny", "window_turns": 2, "turns": []})
    shown = described(capsys, str(game), *(["--prompt"] if prompt else []))
    assert shown["num_turns"] == 0 and shown["num_tokens"] == 0 and shown["tokens"] == shown["game_turns"] == []
    assert shown["num_query_tokens"] == 30 + 16 and ("labels" in shown) != prompt


def test_the_tokenizer_is_the_one_the_game_read(tmp_path, capsys):
    """As the game picks it: the LLM folder's own when model.mllm.tokenizer is empty, and for ``words`` the
    copy in the phase (b) export the game names."""
    from animegamer.contracts.exports import TOKENIZER_DIR
    from animegamer.mllm.tokens import byte_tokenizer

    saved = tmp_path / "export" / TOKENIZER_DIR
    byte_tokenizer().save_pretrained(str(saved))
    game = write_game(tmp_path, {"model": "tiny", "sources": {"mllm": [str(saved.parent)]}, "turns": [turn("run")]})
    assert described(capsys, str(game), f"model.mllm.path={saved}")["tokenizer"] == str(saved)
    assert described(capsys, str(game), "model.mllm.tokenizer=words")["tokenizer"] == str(saved)
    alone = tmp_path / "alone"
    alone.mkdir()
    assert refused(capsys, str(write_game(alone, {"model": "tiny", "turns": [turn("run")]})),
                   "model.mllm.tokenizer=words").startswith(
        "error: model.mllm.tokenizer=words: the word tokenizer is the copy a phase (b) export holds")


def test_an_instruction_holding_reserved_tokens_is_refused_naming_the_file(tmp_path, capsys):
    game = write_game(tmp_path, {"model": "tiny", "turns": [turn("run <ML> now")]})
    assert refused(capsys, str(game)).startswith(f"error: {game}: instruction 'run <ML> now' contains reserved "
                                                 "tokens")
