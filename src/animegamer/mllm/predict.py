"""Next-state prediction: the game engine's step, shared by the game loop, evaluation and adaptation data.

Two readings of one prompt that ends in ``<ML>``: greedy generation of the 12 state tokens, and the
hidden states at exactly the target's query positions, through ``output_proj``, for the
representation (the official code read the last N positions, three tokens off). Both come from the
same prefill, so the prompt is run once.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from animegamer.contracts.states import CHARACTER_STATES, ML_RANGE
from animegamer.mllm.collate import Example, collate_sequences
from animegamer.mllm.masks import attention_mask_4d
from animegamer.mllm.sequence import STATE_RANGE, Turn, build_prompt, parse_states
from animegamer.mllm.tokens import TokenIds

STATE_TOKENS = 12  # <Strength_m></ML><SC><Strength_s></SC><ET><Strength_e></ET><ST><Strength_t></ST></TURN>


@dataclass(frozen=True)
class HistoryTurn:
    turn: Turn
    rep: torch.Tensor  # (N, D)


@dataclass(frozen=True)
class Prediction:
    states: dict[str, int]  # ML, SC, ET, ST
    rep: torch.Tensor  # (N, D)
    tokens: list[int]


def window(history: Sequence[HistoryTurn], window_turns: int) -> list[HistoryTurn]:
    """The sliding window: the last ``window_turns - 1`` turns (the new turn is the window's last)."""
    return list(history)[-(window_turns - 1):] if window_turns > 1 else []


def prompt_batch(model, tokenizer, ids: TokenIds, history: Sequence[HistoryTurn], instruction: str,
                 window_turns: int) -> dict:
    """The left-padded batch (of one) of the inference prompt, on the model's device."""
    return prompts_batch(model, tokenizer, ids, [history], [instruction], window_turns)


def prompts_batch(model, tokenizer, ids: TokenIds, histories: Sequence[Sequence[HistoryTurn]],
                  instructions: Sequence[str], window_turns: int) -> dict:
    """The left-padded batch of several games' inference prompts (one row per game), on the model's device."""
    examples = []
    for history, instruction in zip(histories, instructions, strict=True):
        past = window(history, window_turns)
        prompt = build_prompt(ids, tokenizer, [h.turn for h in past], instruction, model.num_query_tokens)
        reps = torch.stack([h.rep for h in past]) if past else torch.zeros(0, model.num_query_tokens, model.rep_width)
        examples.append(Example(prompt, reps))
    batch = collate_sequences(examples, pad_id=ids.pad, padding_side="left")
    device = next(model.parameters()).device
    return {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()}


MOTION_LEVELS = range(ML_RANGE[0], ML_RANGE[1] + 1)
STATE_VALUES = range(STATE_RANGE[0], STATE_RANGE[1] + 1)


def state_grammar(ids: TokenIds) -> list[list[int]]:
    """Allowed ids per generated position: the markers of the state layout, and at each value slot
    the ``<Strength_k>`` tokens its state may take (ML 1..5, the others -5..5). Constrained decoding
    picks the model's most likely *valid* continuation; the layout comes from ``state_ids``."""
    grammar = [[ids.strength(k) for k in MOTION_LEVELS], [ids.ml_end]]
    for key in CHARACTER_STATES:
        open_id, close_id = ids.state_tags(key)
        grammar += [[open_id], [ids.strength(k) for k in STATE_VALUES], [close_id]]
    return grammar + [[ids.turn_end]]


@torch.no_grad()
def generate(model, ids: TokenIds, batch: dict, constrained: bool = False) -> tuple[list[int], torch.Tensor]:
    """(generated state token ids, representation (N, D)) from one prefill of the prompt.

    ``constrained``: greedy over :func:`state_grammar` instead of the whole vocabulary (the official
    release decodes freely; a free generation that breaks the layout raises in :func:`parse_states`)."""
    return generate_rows(model, ids, batch, constrained)[0]


@torch.no_grad()
def generate_rows(model, ids: TokenIds, batch: dict, constrained: bool = False) -> list[tuple[list[int], torch.Tensor]]:
    """:func:`generate` for every row of a left-padded batch: each row's tokens end at its own
    ``</TURN>`` (the batch repeats it after a row stops), as a batch of one would have stopped."""
    mask = attention_mask_4d(batch["query_mask"], batch["padding_mask"], dtype=model.llm.dtype)
    out = model.generate_states(batch["input_ids"], mask, batch["history_reps"].to(model.llm.dtype),
                                batch["history_index"], batch["query_mask"], max_new_tokens=STATE_TOKENS,
                                stop_token_id=ids.turn_end, position_ids=batch["position_ids"],
                                padding_mask=batch["padding_mask"],
                                allowed_tokens=state_grammar(ids) if constrained else None)
    rows = []
    for tokens, rep in zip(out["tokens"].tolist(), out["pred"].float().cpu()):
        end = tokens.index(ids.turn_end) + 1 if ids.turn_end in tokens else len(tokens)
        rows.append((tokens[:end], rep))
    return rows


def predict_next(model, tokenizer, ids: TokenIds, history: Sequence[HistoryTurn], instruction: str,
                 window_turns: int, constrained: bool = False) -> Prediction:
    """States and representation of the turn ``instruction`` after ``history`` (oldest first).

    A generation that is not exactly the 12 state tokens raises ValueError with its text.
    """
    tokens, rep = generate(model, ids, prompt_batch(model, tokenizer, ids, history, instruction, window_turns),
                           constrained)
    return Prediction(parse_states(ids, tokens, tokenizer), rep, tokens)
