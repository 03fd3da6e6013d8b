"""The game-state MLLM's data side: vocabulary, sequence layout, masks, batches.

- ``tokens``: the 284 AnimeGamer token names, tokenizer loading (local folder or an offline byte
  tokenizer), adding the tokens, :class:`TokenIds` (every id looked up by name), embedding resize.
- ``sequence``: :class:`Turn`, :func:`build_sequence` (training window), :func:`build_prompt`
  (inference prompt ending in ``<ML>``), :func:`parse_states` (strict parse of a generation).
- ``masks``: the attention rule (causal, bidirectional over the target's query block) as a bool
  matrix, an additive 4-D mask and a FlexAttention block mask.
- ``collate``: sessions, :class:`WindowSampler`, :func:`collate_sequences` (the batch dict) and the
  model-side :func:`scatter_history` / :func:`gather_queries`.
- ``inspect``: a game's tokens and masks, described for ``animegamer inspect GAME.json``.
"""
from animegamer.mllm.collate import (
    Example,
    Session,
    Window,
    WindowSampler,
    collate_sequences,
    gather_queries,
    make_example,
    scatter_history,
)
from animegamer.mllm.masks import allowed_matrix, attention_mask_4d, flex_block_mask
from animegamer.mllm.sequence import (
    IGNORE_INDEX,
    GameSequence,
    PromptSequence,
    Turn,
    build_prompt,
    build_sequence,
    parse_states,
)
from animegamer.mllm.tokens import (
    ANIMEGAMER_TOKENS,
    TokenIds,
    add_animegamer_tokens,
    byte_tokenizer,
    load_tokenizer,
    resize_embeddings,
)

__all__ = [
    "ANIMEGAMER_TOKENS", "IGNORE_INDEX", "Example", "GameSequence", "PromptSequence", "Session", "TokenIds",
    "Turn", "Window", "WindowSampler", "add_animegamer_tokens", "allowed_matrix", "attention_mask_4d",
    "build_prompt", "build_sequence", "byte_tokenizer", "collate_sequences", "flex_block_mask",
    "gather_queries", "load_tokenizer", "make_example", "parse_states", "resize_embeddings", "scatter_history",
]
