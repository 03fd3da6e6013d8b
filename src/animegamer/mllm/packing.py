"""Phase (b) batches packed instead of padded: several training sequences share a row.

Windows of 1..5 turns range from ~300 to ~1,400 tokens, so a padded batch spends much of its compute
on padding. Packing fills rows up to ``capacity`` tokens (first fit, longest first) and marks each
token with its sequence's ``document_ids``; the attention rule of :mod:`animegamer.mllm.masks` then
also requires the same document, positions restart at 0 per sequence, and the losses are the padded
batch's (cross-entropy over every label token, MSE over every target rep).

Keys are those of :func:`animegamer.mllm.collate.collate_sequences` (right padding), with per-row
meanings where a row holds several sequences:

=================  =================  ==========================================================
``document_ids``   (R, L) long        index of the token's sequence in the packed order, -1 on padding
``query_mask``     (R, L) bool        N query positions per sequence in the row
``history_index``  (R, L) long        index into the row's histories, concatenated in row order
``history_reps``   (R, H_max, N, D)   each row's history turns, its sequences' in row order
``history_counts`` (R,) long          history turns per row
``lengths``        (S,) long          length of each sequence, in packed order
``target_rep``     (S, N, D)          per sequence, in packed order (the order queries are read in)
``keys``           list[str]          per sequence, in packed order
=================  =================  ==========================================================
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

from animegamer.data.indexed import SKIPPED
from animegamer.mllm.collate import Example, _as_tensor, round_up
from animegamer.mllm.sequence import IGNORE_INDEX


def assign_rows(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """First-fit decreasing: item indices per row, each row's total <= ``capacity`` (a longer item
    gets a row of its own). Deterministic: ties keep the input order."""
    rows: list[list[int]] = []
    room: list[int] = []
    for index in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        for row, free in enumerate(room):
            if lengths[index] <= free:
                rows[row].append(index)
                room[row] -= lengths[index]
                break
        else:
            rows.append([index])
            room.append(capacity - lengths[index])
    return rows


def pack_sequences(items: Sequence[Example], pad_id: int, capacity: int,
                   rep_dtype: torch.dtype | None = torch.float32, pad_to_multiple_of: int = 0) -> dict[str, Any]:
    """Training examples (with target reps) -> a packed batch (see the module docstring); the row
    width is rounded up to a multiple of ``pad_to_multiple_of`` when set."""
    if not items:
        raise ValueError("cannot pack an empty list")
    n = items[0].sequence.num_query_tokens
    rows = assign_rows([len(e.sequence) for e in items], capacity)
    order = [index for row in rows for index in row]  # packed order: row by row
    width = round_up(max(sum(len(items[i].sequence) for i in row) for row in rows), pad_to_multiple_of)
    shape = (len(rows), width)
    input_ids = torch.full(shape, int(pad_id), dtype=torch.long)
    padding_mask = torch.zeros(shape, dtype=torch.bool)
    position_ids = torch.zeros(shape, dtype=torch.long)
    query_mask = torch.zeros(shape, dtype=torch.bool)
    history_index = torch.full(shape, -1, dtype=torch.long)
    labels = torch.full(shape, IGNORE_INDEX, dtype=torch.long)
    document_ids = torch.full(shape, -1, dtype=torch.long)
    histories = []
    document = 0
    for r, row in enumerate(rows):
        offset, turns, row_history = 0, 0, []
        for index in row:
            seq = items[index].sequence
            span = slice(offset, offset + len(seq))
            input_ids[r, span] = torch.tensor(seq.input_ids, dtype=torch.long)
            padding_mask[r, span] = True
            position_ids[r, span] = torch.arange(len(seq))  # each sequence starts at position 0
            query_mask[r, span] = torch.tensor(seq.query_mask, dtype=torch.bool)
            local = torch.tensor(seq.history_index, dtype=torch.long)
            # k * N + i within the sequence -> within the row's concatenated histories
            history_index[r, span] = torch.where(local >= 0, local + turns * n, local)
            labels[r, span] = torch.tensor(seq.labels, dtype=torch.long)
            document_ids[r, span] = document
            row_history.append(_as_tensor(items[index].history_reps, rep_dtype))
            offset, turns, document = offset + len(seq), turns + seq.num_history, document + 1
        histories.append(torch.cat(row_history))
    dim = histories[0].shape[-1]
    reps = torch.zeros((len(rows), max(h.shape[0] for h in histories), n, dim), dtype=histories[0].dtype)
    for r, history in enumerate(histories):
        reps[r, : history.shape[0]] = history
    out: dict[str, Any] = {
        "input_ids": input_ids, "padding_mask": padding_mask, "position_ids": position_ids,
        "lengths": torch.tensor([len(items[i].sequence) for i in order], dtype=torch.long),
        "query_mask": query_mask, "history_index": history_index, "history_mask": history_index >= 0,
        "labels": labels, "document_ids": document_ids, "history_reps": reps,
        "history_counts": torch.tensor([h.shape[0] for h in histories], dtype=torch.long),
        "target_rep": torch.stack([_as_tensor(items[i].target_rep, rep_dtype) for i in order]),
        "keys": [items[i].key for i in order],
    }
    skipped = [record for e in items for record in e.skipped]
    if skipped:
        out[SKIPPED] = skipped
    return out
