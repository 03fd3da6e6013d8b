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
``query_index``    (S, N) long        each sequence's query positions in the flattened batch, in
                                      packed order (that of ``target_rep``)
=================  =================  ==========================================================
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

from animegamer.contracts.shards import SKIPPED
from animegamer.mllm.collate import (Example, _as_tensor, add_host_indices, padded_token_fields, place_sequence,
                                     round_up, stack_histories)


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
    width is rounded up to a multiple of ``pad_to_multiple_of`` when set, so rows may be up to
    ``pad_to_multiple_of - 1`` padding tokens wider than ``capacity``."""
    if not items:
        raise ValueError("cannot pack an empty list")
    n = items[0].sequence.num_query_tokens
    rows = assign_rows([len(e.sequence) for e in items], capacity)
    order = [index for row in rows for index in row]  # packed order: row by row
    width = round_up(max(sum(len(items[i].sequence) for i in row) for row in rows), pad_to_multiple_of)
    fields = padded_token_fields(len(rows), width, pad_id)
    document_ids = torch.full((len(rows), width), -1, dtype=torch.long)
    histories = []
    document = 0
    for r, row in enumerate(rows):
        offset, turns, row_history = 0, 0, []
        for index in row:
            seq = items[index].sequence
            span = slice(offset, offset + len(seq))
            # history indices point into the row's histories, concatenated in row order
            place_sequence(fields, r, span, seq, history_offset=turns * n)
            document_ids[r, span] = document
            row_history.append(_as_tensor(items[index].history_reps, rep_dtype))
            offset, turns, document = offset + len(seq), turns + seq.num_history, document + 1
        histories.append(torch.cat(row_history))
    reps, counts = stack_histories(histories, n)
    out: dict[str, Any] = {
        **fields, "lengths": torch.tensor([len(items[i].sequence) for i in order], dtype=torch.long),
        "history_mask": fields["history_index"] >= 0, "document_ids": document_ids, "history_reps": reps,
        "history_counts": counts,
        "target_rep": torch.stack([_as_tensor(items[i].target_rep, rep_dtype) for i in order]),
        "keys": [items[i].key for i in order],
    }
    skipped = [record for e in items for record in e.skipped]
    if skipped:
        out[SKIPPED] = skipped
    return add_host_indices(out, n)
