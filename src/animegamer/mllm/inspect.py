"""The token layout of a game file, the body of ``animegamer inspect GAME.json`` (``animegamer.cli.inspect``).

GAME.json is the ``game.json`` that ``animegamer play`` writes (each turn's states are the ones its MLLM
generated, ``predicted``), or ``{"turns": [{"instruction": ..., "states": {"ML": .., "SC": .., "ET": .., "ST": ..}},
...]}`` as a session-shard ``json`` record holds them. Every turn but the last is history; the last is the
target. The description: the tokens, ids, masks and labels of the training sequence (or, with
``--prompt``, of the inference prompt ending in ``<ML>``), plus a compact one-line rendering.
"""
from __future__ import annotations

from typing import Mapping

from animegamer.contracts.shards import INSTRUCTION, STATES
from animegamer.contracts.states import PLAYED_STATES
from animegamer.errors import InvalidInputError
from animegamer.mllm.sequence import IGNORE_INDEX, GameSequence, Turn, build_prompt, build_sequence
from animegamer.mllm.tokens import TokenIds, add_animegamer_tokens, load_tokenizer


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


def describe(game: dict, tokenizer_dir: str | None, num_query_tokens: int, prompt: bool) -> dict:
    turns = game_turns(game)
    tokenizer = load_tokenizer(tokenizer_dir)
    added = add_animegamer_tokens(tokenizer)
    ids = TokenIds.from_tokenizer(tokenizer)
    if prompt:
        seq = build_prompt(ids, tokenizer, turns[:-1], turns[-1].instruction, num_query_tokens)
    else:
        seq = build_sequence(ids, tokenizer, turns, num_query_tokens)
    tokens = tokenizer.convert_ids_to_tokens(seq.input_ids)
    out = {
        "tokenizer": tokenizer_dir or "byte_tokenizer",
        "vocab_size": len(tokenizer),
        "tokens_added": len(added),
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
