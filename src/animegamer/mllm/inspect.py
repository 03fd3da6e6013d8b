"""The token layout of a game file, the body of ``animegamer inspect GAME.json`` (``animegamer.cli.inspect``).

GAME.json is the ``game.json`` that ``animegamer play`` writes (each turn's states are the ones its MLLM
generated, ``predicted``), or ``{"turns": [{"instruction": ..., "states": {"ML": .., "SC": .., "ET": .., "ST": ..}},
...]}`` as a session-shard ``json`` record holds them. The last turn is the target; the turns before it in
the window are its history (every earlier turn when no window is given), as the game's MLLM read them. The
description: the tokens, ids, masks and labels of the training sequence (or, with ``--prompt``, of the
inference prompt ending in ``<ML>``), plus a compact one-line rendering. A game of no turns has no sequence:
its description has empty lists.
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping, Optional

from animegamer.contracts.exports import TOKENIZER_DIR
from animegamer.contracts.shards import INSTRUCTION, STATES
from animegamer.contracts.states import PLAYED_STATES
from animegamer.errors import InvalidInputError
from animegamer.mllm.predict import window
from animegamer.mllm.sequence import IGNORE_INDEX, GameSequence, Turn, build_prompt, build_sequence
from animegamer.mllm.tokens import NUM_FRAME_TOKENS, TokenIds, add_animegamer_tokens, load_tokenizer
from animegamer.mllm.words import WORDS

# A Hugging Face tokenizer folder holds at least one of these (save_pretrained writes the first).
TOKENIZER_FILES = ("tokenizer_config.json", "tokenizer.json", "tokenizer.model")


def query_token_range() -> tuple[int, int]:
    """The N (frame tokens per turn) the layout can hold: at least one query, at most one per ``<frame_i>``
    token (what :mod:`animegamer.mllm.sequence` accepts)."""
    return 1, NUM_FRAME_TOKENS


def compact(tokens: list[str], query_mask: list[bool], history_turn: list[int]) -> str:
    """The sequence as one string, each run of frame tokens shown as ``[history k: N]`` / ``[query: N]``."""
    parts, p = [], 0
    while p < len(tokens):
        if query_mask[p] or history_turn[p] >= 0:
            q = p
            while q < len(tokens) and query_mask[q] == query_mask[p] and history_turn[q] == history_turn[p]:
                q += 1
            what = "query" if query_mask[p] else f"history {history_turn[p]}"
            parts.append(f"[{what}: {tokens[p]}..{tokens[q - 1]} x{q - p}]")
            p = q
        else:
            parts.append(tokens[p])
            p += 1
    return "".join(parts)


def game_turns(game: dict) -> list[Turn]:
    """The turns of a game file, each with the states a training sequence carries (``states``, or
    ``predicted`` in a played game); a turn without them, or with values out of range, is refused naming it."""
    turns = []
    for index, record in enumerate(game["turns"]):
        states = record.get(STATES, record.get(PLAYED_STATES)) if isinstance(record, Mapping) else None
        if states is None or INSTRUCTION not in record:
            raise InvalidInputError(f"turn {index} lacks its '{INSTRUCTION}' or its states ('{STATES}', or "
                                    f"'{PLAYED_STATES}' in the game.json animegamer play writes)")
        try:
            turns.append(Turn(record[INSTRUCTION], dict(states)))
        except (TypeError, ValueError) as error:
            raise InvalidInputError(f"turn {index}: {error}") from None
    return turns


def open_tokenizer(tokenizer_dir: Optional[str]):
    """The tokenizer of the folder ``tokenizer_dir`` (empty: the byte tokenizer). A missing path, a file, a
    folder without tokenizer files or one the loader cannot read is refused, the reason without the path."""
    if tokenizer_dir:
        folder = Path(tokenizer_dir)
        if not folder.exists():
            raise InvalidInputError("no such folder")
        if not folder.is_dir():
            raise InvalidInputError("not a folder (a tokenizer is a folder holding tokenizer_config.json, "
                                    "tokenizer.json or tokenizer.model)")
        if not any((folder / name).is_file() for name in TOKENIZER_FILES):
            raise InvalidInputError(f"the folder holds no tokenizer (none of {', '.join(TOKENIZER_FILES)})")
    try:
        return load_tokenizer(tokenizer_dir)
    # A folder holding broken or foreign files makes the loader raise whatever its parser raises (OSError,
    # ValueError, the Rust tokenizers' plain Exception): each is a problem of the folder the user named.
    except Exception as error:  # noqa: BLE001
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise InvalidInputError(f"no tokenizer loads from this folder ({reason})") from None


def configured_tokenizer(mllm, game: dict) -> tuple[str, str]:
    """(folder, what names it) of the tokenizer the game's MLLM read, as the game picks it
    (``animegamer.models.game_mllm``): ``model.mllm.tokenizer``, else the LLM folder's own, else the byte
    tokenizer (folder ''); ``words`` is the copy in the game's phase (b) export (its ``sources``)."""
    if mllm.tokenizer == WORDS:
        sources = game.get("sources")
        exports = sources.get("mllm") if isinstance(sources, Mapping) else None
        saved = Path(exports[-1]) / TOKENIZER_DIR if isinstance(exports, list) and exports else None
        if saved is None or not saved.is_dir():
            raise InvalidInputError(f"model.mllm.tokenizer={WORDS}: the word tokenizer is the copy a phase (b) "
                                    f"export holds ({TOKENIZER_DIR}/), and the game names no export holding one; "
                                    f"give that folder with --tokenizer DIR")
        return str(saved), "the game's phase (b) export"
    if mllm.tokenizer:
        return mllm.tokenizer, "model.mllm.tokenizer"
    if mllm.path and Path(mllm.path).is_dir():  # the game reads the LLM folder's tokenizer when it has one
        return mllm.path, "model.mllm.path"
    return "", "model.mllm.tokenizer"


def window_of(turns: list[Turn], window_turns: Optional[int]) -> tuple[list[Turn], int]:
    """The turns the MLLM read for the last turn, as the game cuts them (the last ``window_turns - 1``
    before it; every one when ``window_turns`` is None), and the game's index of the first one."""
    history = turns[:-1] if window_turns is None else window(turns[:-1], window_turns)
    return [*history, turns[-1]], len(turns) - 1 - len(history)


def describe(turns: list[Turn], tokenizer, tokenizer_name: str, num_query_tokens: int, prompt: bool,
             window_turns: Optional[int] = None) -> dict:
    added = add_animegamer_tokens(tokenizer)
    ids = TokenIds.from_tokenizer(tokenizer)
    head = {"tokenizer": tokenizer_name or "byte_tokenizer", "vocab_size": len(tokenizer),
            "tokens_added": len(added), "num_turns": len(turns)}
    if not turns:  # an interactive game ended before its first turn: nothing was read
        out = {**head, "game_turns": [], "num_tokens": 0, "num_history": 0, "num_query_tokens": num_query_tokens,
               "turn_starts": [], "frame_starts": [], "query_positions": [], "compact": "", "tokens": [],
               "input_ids": [], "query_mask": [], "history_turn": []}
        return out if prompt else {**out, "label_start": None, "labels": [], "label_tokens": []}
    shown, first = window_of(turns, window_turns)
    try:  # an instruction holding the layout's reserved tokens (<ML>, <TURN>, ...) has no sequence
        if prompt:
            seq = build_prompt(ids, tokenizer, shown[:-1], shown[-1].instruction, num_query_tokens)
        else:
            seq = build_sequence(ids, tokenizer, shown, num_query_tokens)
    except ValueError as error:
        raise InvalidInputError(str(error)) from None
    tokens = tokenizer.convert_ids_to_tokens(seq.input_ids)
    out = {
        **head,
        "game_turns": list(range(first, len(turns))),  # the game's turns in the sequence, oldest first
        "num_tokens": len(seq),
        "num_history": seq.num_history,
        "num_query_tokens": seq.num_query_tokens,
        "turn_starts": seq.turn_starts,
        "frame_starts": seq.frame_starts,
        "query_positions": [seq.query_positions[0], seq.query_positions[-1]],
        "compact": compact(tokens, seq.query_mask, seq.history_turn),
        "tokens": tokens,
        "input_ids": seq.input_ids,
        "query_mask": [int(b) for b in seq.query_mask],
        "history_turn": seq.history_turn,
    }
    if isinstance(seq, GameSequence):
        out["label_start"] = seq.label_start
        out["labels"] = seq.labels
        out["label_tokens"] = [tok for tok, lab in zip(tokens, seq.labels) if lab != IGNORE_INDEX]
    return out
