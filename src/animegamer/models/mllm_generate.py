"""Greedy decoding of game-state tokens with a KV cache (:meth:`StateGeneration.generate_states`), a
part of :class:`animegamer.models.mllm.GameStateMLLM`.

Inference is one prefill over the prompt (which already holds the query block and its bidirectional
mask) giving ``pred``, then a greedy KV-cache loop for the state tokens. The official code runs two
passes over the same prompt; one is enough because the query positions' hidden states do not depend
on anything after the prompt.
"""
from __future__ import annotations

import inspect
from typing import Dict, Optional, Sequence

import torch
from torch import nn

from animegamer.models.attention_kernels import attention_kernels


def token_positions(position_ids: Optional[torch.Tensor], padding_mask: Optional[torch.Tensor],
                    input_ids: torch.Tensor) -> torch.Tensor:
    """Given positions, or 0.. over the real tokens of each row (left or right padding), (B, L)."""
    if position_ids is not None:
        return position_ids
    if padding_mask is None:
        return torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
    return (padding_mask.long().cumsum(dim=1) - 1).clamp(min=0)


def _new_cache(config):
    """An empty DynamicCache (built from the config where the installed transformers takes one)."""
    from transformers import DynamicCache

    try:
        return DynamicCache(config=config)
    except TypeError:
        return DynamicCache()


def _cache_keyword(decoder: nn.Module) -> str:
    """The decoder's name for the KV cache argument: ``cache`` in recent transformers 5 releases,
    ``past_key_values`` before (an unknown keyword would be swallowed by ``**kwargs`` and ignored)."""
    return "cache" if "cache" in inspect.signature(decoder.forward).parameters else "past_key_values"


def _greedy(logits: torch.Tensor, allowed: Optional[Sequence[Sequence[int]]], step: int) -> torch.Tensor:
    """argmax, over ``allowed[step]`` only when constrained decoding gives a set for this step."""
    if allowed is None or step >= len(allowed):
        return logits.argmax(dim=-1)
    ids = torch.as_tensor(list(allowed[step]), device=logits.device)
    return ids[logits[:, ids].argmax(dim=-1)]


class StateGeneration:
    """Decoding for the game-state MLLM: reads its ``causal_lm``, ``cfg``, ``embed_inputs`` and the
    mask, query and projection pieces of its forward."""

    @torch.no_grad()
    def generate_states(self, prompt_ids: torch.Tensor, attention_mask_4d: Optional[torch.Tensor] = None,
                        history_reps: Optional[torch.Tensor] = None, history_index: Optional[torch.Tensor] = None,
                        query_mask: Optional[torch.Tensor] = None, max_new_tokens: int = 12,
                        stop_token_id: Optional[int] = None, position_ids: Optional[torch.Tensor] = None,
                        padding_mask: Optional[torch.Tensor] = None,
                        allowed_tokens: Optional[Sequence[Sequence[int]]] = None) -> Dict[str, Optional[torch.Tensor]]:
        """Greedy state tokens after a prompt ending in ``<ML>``, and the representation from the same prefill.

        Returns ``tokens`` (B, T) with T <= max_new_tokens (after ``stop_token_id``, e.g.
        ``</TURN>``, a row repeats it until every row has stopped) and ``pred`` (B, N, D) read at
        the query positions of the prompt (None without query_mask). Padded prompts must be left
        padded (the last prompt position is real in every row; ``collate_sequences(...,
        padding_side="left")``); the keys a row may attend to later are those its last prompt
        position attends to. A custom 4-D mask does not apply Mistral's sliding window, so prompt +
        new tokens must fit in it. Call it in eval mode (LoRA dropout is active in train mode).
        """
        lm = self.causal_lm
        batch, length = prompt_ids.shape
        window = getattr(lm.config, "sliding_window", None)
        if window is not None and length + max_new_tokens > window:
            raise ValueError(f"prompt ({length}) + new tokens ({max_new_tokens}) exceed the sliding window {window}")
        if padding_mask is not None and not bool(padding_mask[:, -1].all()):
            raise ValueError("batched prompts must be left padded: the last position of every row must be real")
        embeds = self.embed_inputs(prompt_ids, history_reps, history_index)
        allowed = self._allowed_mask(attention_mask_4d, query_mask, padding_mask, prompt_ids)
        if not isinstance(allowed, torch.Tensor):
            raise ValueError("generate_states needs a tensor mask, not a BlockMask")
        position_ids = token_positions(position_ids, padding_mask, prompt_ids)
        with attention_kernels(self.cfg.attention_backends, embeds.is_cuda):
            return self._greedy_states(embeds, allowed, position_ids, query_mask, max_new_tokens, stop_token_id,
                                       allowed_tokens)

    def _greedy_states(self, embeds: torch.Tensor, allowed: torch.Tensor, position_ids: torch.Tensor,
                       query_mask: Optional[torch.Tensor], max_new_tokens: int, stop_token_id: Optional[int],
                       allowed_tokens: Optional[Sequence[Sequence[int]]]) -> Dict[str, Optional[torch.Tensor]]:
        """The prefill and the greedy loop of :meth:`generate_states`: ``embeds`` (B, L, H) with the
        history scattered in, ``allowed`` (B, 1, L, L) bool, ``position_ids`` (B, L), ``query_mask``
        (B, L) or None."""
        lm = self.causal_lm
        batch = embeds.shape[0]
        cache = {_cache_keyword(lm.model): _new_cache(lm.config)}
        hidden = lm.model(inputs_embeds=embeds, attention_mask=self._kernel_mask(allowed, embeds.dtype),
                          position_ids=position_ids, use_cache=True, **cache).last_hidden_state
        pred = self._project_out(self._query_hidden(hidden, query_mask)) if query_mask is not None else None

        keys = allowed[:, 0, -1, :]  # (B, L): what the last prompt position sees
        position = position_ids[:, -1:].clone()
        pick = lambda h, step: _greedy(lm.get_output_embeddings()(h), allowed_tokens, step)
        token = pick(hidden[:, -1], 0)
        done = torch.zeros(batch, dtype=torch.bool, device=embeds.device)
        tokens = []
        for step in range(max_new_tokens):
            if stop_token_id is not None:
                token = token.masked_fill(done, stop_token_id)
                done |= token == stop_token_id
            tokens.append(token)
            if step == max_new_tokens - 1 or bool(done.all()):
                break
            keys = torch.cat([keys, torch.ones(batch, 1, dtype=torch.bool, device=keys.device)], dim=1)
            position = position + 1
            step_embeds = lm.get_input_embeddings()(token[:, None])
            step_mask = self._kernel_mask(keys[:, None, None, :], step_embeds.dtype)
            hidden = lm.model(inputs_embeds=step_embeds, attention_mask=step_mask, position_ids=position,
                              use_cache=True, **cache).last_hidden_state
            token = pick(hidden[:, -1], step + 1)
        stacked = torch.stack(tokens, dim=1) if tokens else position_ids.new_zeros(batch, 0)
        return dict(tokens=stacked, pred=pred)
