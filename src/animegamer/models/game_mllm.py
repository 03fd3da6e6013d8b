"""The game-state MLLM with its tokenizer, and the one place it is assembled and loaded.

Phase (b) trains it, the pipeline's adaptation step predicts with it and the game plays with it: each
builds it with :func:`build_game_mllm` (tokenizer with every AnimeGamer token, seeded network sized
to that tokenizer, official checkpoint, exports), and runs a collated batch with :func:`run_batch`.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from animegamer.checkpoints.export import load_export, recorded_start
from animegamer.config.schema import RunConfig
from animegamer.contracts.exports import TOKENIZER_DIR
from animegamer.mllm.collate import LABEL_INDEX, QUERY_INDEX
from animegamer.mllm.masks import flex_block_mask
from animegamer.mllm.tokens import TokenIds, add_animegamer_tokens, load_tokenizer
from animegamer.mllm.words import WORDS
from animegamer.models.encoder import representation_tokens
from animegamer.models.mllm import GameStateMLLM
from animegamer.models.official_mllm import load_official_mllm

log = logging.getLogger(__name__)

# The collated batch's entries the network reads (:mod:`animegamer.mllm.collate`); the rest (lengths,
# keys) is bookkeeping.
MODEL_KEYS = ("input_ids", "history_reps", "history_index", "query_mask", "labels", "target_rep", "position_ids",
              "padding_mask", "document_ids", QUERY_INDEX, LABEL_INDEX)
# Builds the ``model.mllm.tokenizer=words`` tokenizer of a run config from its data (the data layer's
# :func:`animegamer.data.words.training_word_tokenizer`); the model layer reads no data itself.
WordsSource = Callable[[RunConfig], Any]


@dataclass
class TokenizedMLLM:
    """What predicting a turn needs: the network, its tokenizer and the AnimeGamer token ids."""

    model: GameStateMLLM
    tokenizer: Any  # a Hugging Face tokenizer
    ids: TokenIds


def _tokenizer(cfg: RunConfig, exports: Sequence[str | Path], words: Optional[WordsSource]):
    """The configured tokenizer; ``words``: the newest export's own copy, else ``words(cfg)`` (built from
    the training split's instructions)."""
    mllm = cfg.model.mllm
    if mllm.tokenizer != WORDS:
        return load_tokenizer(mllm.tokenizer or mllm.path or None)
    saved = Path(exports[-1]) / TOKENIZER_DIR if exports else None
    if saved is not None and saved.is_dir():
        return load_tokenizer(str(saved))
    if words is None:
        where = f"the phase (b) export {exports[-1]} holds no {TOKENIZER_DIR}/" if exports else "no phase (b) export is given"
        raise ValueError(f"model.mllm.tokenizer={WORDS}: {where}, and this command builds no word vocabulary "
                         "from data")
    return words(cfg)


def game_tokenizer(cfg: RunConfig, exports: Sequence[str | Path] = (), words: Optional[WordsSource] = None):
    """The configured tokenizer with every AnimeGamer token present, and its ids by name. ``words``: how
    the ``words`` tokenizer is built when no export holds its copy (:data:`WordsSource`)."""
    tokenizer = _tokenizer(cfg, exports, words)
    added = add_animegamer_tokens(tokenizer)
    if added:
        log.info("added %d AnimeGamer tokens to the tokenizer", len(added))
    return tokenizer, TokenIds.from_tokenizer(tokenizer)


def build_mllm(cfg: RunConfig, vocab_size: int) -> GameStateMLLM:
    """The network alone, seeded by ``cfg.seed``, for a tokenizer of ``vocab_size`` tokens."""
    return GameStateMLLM(cfg.model.mllm, cfg.model.encoder.width, representation_tokens(cfg.model.encoder),
                         vocab_size, seed=cfg.seed)


def import_official_mllm(model: GameStateMLLM, path: str) -> None:
    """The official MLLM checkpoint into ``model``; anything unplaced is an error."""
    report = load_official_mllm(path, model)
    if not report.ok:
        raise ValueError(f"{path}: {report.summary()}")


def seeded_as_trained(cfg: RunConfig, exports: Sequence[str | Path]) -> RunConfig:
    """``cfg`` with the seed the newest export's run built its network with: the export holds only the
    trained tensors, so the game, the evaluation and the adaptation step must rebuild the same frozen
    rest (a random-weight preset's comes from the seed) whatever their own ``seed`` is."""
    seed = recorded_start(exports[-1])[0] if exports else None
    if seed is None or int(seed) == cfg.seed:
        return cfg
    log.info("building the MLLM with seed %s, the seed %s was trained with (not %s)", seed, exports[-1], cfg.seed)
    return replace(cfg, seed=int(seed))


def build_game_mllm(cfg: RunConfig, exports: Sequence[str | Path] = (),
                    words: Optional[WordsSource] = None) -> TokenizedMLLM:
    """The game-state MLLM of ``cfg``: the tokenizer, the network sized to it, the official checkpoint
    when the config names one, then each phase (b) export in order, each over the last.

    ``words``: builds the ``model.mllm.tokenizer=words`` tokenizer from ``cfg``'s data when no export
    holds its copy (phase (b) and the game pass :func:`animegamer.data.words.training_word_tokenizer`);
    None: an export's copy is the only source."""
    cfg = seeded_as_trained(cfg, exports)
    tokenizer, ids = game_tokenizer(cfg, exports, words)
    model = build_mllm(cfg, len(tokenizer))
    if cfg.model.mllm.official_checkpoint:
        import_official_mllm(model, cfg.model.mllm.official_checkpoint)
    for export in exports:
        load_export(export, model)
    return TokenizedMLLM(model, tokenizer, ids)


def attention_for(kind: str, batch: dict):
    """The mask in the form that keeps the kernel fast: a FlexAttention BlockMask (the query block is
    a few 128-blocks, the rest causal, so most blocks are skipped or dense) or None, which lets the
    model build its boolean mask for SDPA / eager."""
    if kind == "flex":
        return flex_block_mask(batch["query_mask"], batch["padding_mask"], document_ids=batch.get("document_ids"))
    return None


def run_batch(model: GameStateMLLM, batch: dict) -> dict:
    """The network on a collated batch (losses where the batch has targets, ``pred`` at the queries)."""
    return model(attention_mask_4d=attention_for(model.cfg.attention, batch),
                 **{key: batch[key] for key in MODEL_KEYS if key in batch})
