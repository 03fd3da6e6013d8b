"""Attention masks of the game-state sequence.

The rule, for query position i and key position j of one sample:

    allowed(i, j) = valid(i) and valid(j) and (j <= i or (query(i) and query(j)))   or   i == j

i.e. causal attention, except that the target turn's N query positions attend to each other in both
directions, and padding is blocked. The ``i == j`` term only matters for padded rows: they attend to
themselves and nothing else, so no softmax row is empty (no NaN); their outputs are never used.

Three forms of the same rule: :func:`allowed_matrix` (bool, True = allowed), :func:`attention_mask_4d`
(additive float, 0 allowed / finfo.min blocked, for SDPA/eager attention as Hugging Face's 4-D
``attention_mask``) and :func:`flex_block_mask` (a FlexAttention ``BlockMask`` for long sequences on GPU).
"""
from __future__ import annotations

import torch
from torch.nn.attention.flex_attention import create_block_mask


def _check(query_mask: torch.Tensor, padding_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if query_mask.ndim != 2 or query_mask.shape != padding_mask.shape:
        raise ValueError(f"query_mask and padding_mask must both be (B, L), got {tuple(query_mask.shape)} "
                         f"and {tuple(padding_mask.shape)}")
    return query_mask.bool(), padding_mask.bool()


def allowed_matrix(query_mask: torch.Tensor, padding_mask: torch.Tensor,
                   document_ids: torch.Tensor | None = None) -> torch.Tensor:
    """(B, L, L) bool, ``[b, i, j]`` True when position i may attend to position j.

    ``query_mask`` (B, L) bool: the target's query positions; ``padding_mask`` (B, L) bool: True on
    real tokens, False on padding; ``document_ids`` (B, L) long for packed rows
    (:mod:`animegamer.mllm.packing`): attention stays inside each sequence.
    """
    query, valid = _check(query_mask, padding_mask)
    length = query.shape[1]
    positions = torch.arange(length, device=query.device)
    causal = positions[None, :] <= positions[:, None]  # (L, L): j <= i
    bidirectional = query[:, :, None] & query[:, None, :]  # (B, L, L)
    allowed = (causal[None] | bidirectional) & valid[:, None, :] & valid[:, :, None]
    if document_ids is not None:
        allowed = allowed & (document_ids[:, :, None] == document_ids[:, None, :])
    return allowed | torch.eye(length, dtype=torch.bool, device=query.device)[None]


def attention_mask_4d(query_mask: torch.Tensor, padding_mask: torch.Tensor,
                      dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(B, 1, L, L) additive mask in ``dtype``: 0 where allowed, ``torch.finfo(dtype).min`` where blocked."""
    allowed = allowed_matrix(query_mask, padding_mask)
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[:, None]


def mask_mod_for(query_mask: torch.Tensor, padding_mask: torch.Tensor, document_ids: torch.Tensor | None = None):
    """The FlexAttention ``mask_mod(b, h, q_idx, kv_idx)`` of the same rule (tensors captured, (B, L))."""
    query, valid = _check(query_mask, padding_mask)
    # Unpacked rows are one document: a zero tensor keeps one mask_mod for both cases.
    documents = document_ids if document_ids is not None else torch.zeros_like(query, dtype=torch.long)

    def mask_mod(b, h, q_idx, kv_idx):
        causal = kv_idx <= q_idx
        bidirectional = query[b, q_idx] & query[b, kv_idx]
        same = documents[b, q_idx] == documents[b, kv_idx]
        return ((causal | bidirectional) & same & valid[b, kv_idx] & valid[b, q_idx]) | (q_idx == kv_idx)

    return mask_mod


def flex_block_mask(query_mask: torch.Tensor, padding_mask: torch.Tensor, block_size: int = 128,
                    compiled: bool = False, document_ids: torch.Tensor | None = None):
    """A FlexAttention ``BlockMask`` (B, 1 head broadcast, L, L) of the same rule, on the masks' device.

    ``compiled=True`` builds it with torch.compile (faster for long sequences on GPU).
    """
    query, valid = _check(query_mask, padding_mask)
    batch, length = query.shape
    return create_block_mask(mask_mod_for(query, valid, document_ids), batch, None, length, length, device=query.device,
                             BLOCK_SIZE=block_size, _compile=compiled)
