"""The frozen T5 v1.1 encoder of the motion text (the shared behaviour: :mod:`animegamer.models.frozen_base`)."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import torch
from torch import nn

from animegamer.config.schema import T5Config
from animegamer.models.frozen_base import (FrozenModule, check_loading_info, count_parameters,
                                          find_folder, resolve_path)
from animegamer.utils.randomness import seeded

if TYPE_CHECKING:  # heavy imports stay inside the functions that need them
    from transformers import PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

# Folder names of the diffusers pipeline layout, tried after the folder itself.
_T5_SUBFOLDERS = ("text_encoder",)
_TOKENIZER_SUBFOLDERS = ("tokenizer",)
_TOKENIZER_FILES = ("tokenizer_config.json", "tokenizer.json", "spiece.model")


class FrozenT5(FrozenModule):
    """T5 v1.1 encoder: ``encode(texts) -> (B, max_tokens, d_model)`` last hidden state.

    Texts are padded/truncated to exactly ``cfg.max_tokens`` (paper: 30) so every sample has the same
    token count, which the representation layout (30 text + 196 image tokens) relies on.
    """

    def __init__(
        self,
        cfg: T5Config,
        *,
        seed: int = 0,
        dtype: torch.dtype = torch.float32,
        random_if_missing: bool = False,
    ) -> None:
        super().__init__()
        self.max_tokens = int(cfg.max_tokens)
        self.attention_mask = bool(cfg.attention_mask)
        path = resolve_path(cfg.path, random_if_missing, "T5")
        if path:
            self.model, self.tokenizer, folder = _load_t5(path, dtype)
            self.from_disk, self.source = True, str(folder)
        else:
            with seeded(seed):
                self.model = _random_t5(cfg)
            self.tokenizer = _byte_tokenizer(cfg.vocab_size)
            self.from_disk, self.source = False, f"random(seed={seed})"
        self.to(dtype)  # random builds are made in float32 first, so every dtype rounds the same weights
        if dtype == torch.float16:
            logger.warning("T5 v1.1 is known to overflow in float16; prefer bfloat16 or float32")
        self._freeze()
        logger.info("T5 encoder: %s, %d params", self.source, count_parameters(self.model))

    @property
    def hidden_size(self) -> int:
        return int(self.model.config.d_model)

    def tokenize(self, texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Token ids and attention mask, both (B, max_tokens) int64, on the model's device."""
        if isinstance(texts, str):
            raise TypeError("texts must be a list of strings, not one string")
        batch = self.tokenizer(
            list(texts),
            padding="max_length",
            max_length=self.max_tokens,
            truncation=True,
            add_special_tokens=True,
            return_tensors="pt",
        )
        return batch.input_ids.to(self.device), batch.attention_mask.to(self.device)

    @torch.no_grad()
    def encode(self, texts: Sequence[str], use_attention_mask: bool | None = None) -> torch.Tensor:
        """Last hidden state (B, max_tokens, d_model); padding positions are T5's own outputs there.

        ``use_attention_mask`` defaults to the config's ``attention_mask`` (off: CogVideoX's pipelines,
        diffusers and SAT alike, run T5 without the mask, and the decoder was trained on that).
        """
        if use_attention_mask is None:
            use_attention_mask = self.attention_mask
        ids, mask = self.tokenize(texts)
        out = self.model(input_ids=ids, attention_mask=mask if use_attention_mask else None)
        return out.last_hidden_state  # (B, max_tokens, d_model)

    forward = encode


def _random_t5(cfg: T5Config) -> nn.Module:
    """T5 v1.1 encoder at the configured sizes: gated-GELU FFN, untied embeddings (the v1.1 recipe)."""
    from transformers import T5Config as HFT5Config
    from transformers import T5EncoderModel

    config = HFT5Config(
        vocab_size=cfg.vocab_size,
        d_model=cfg.d_model,
        d_kv=cfg.d_kv,
        d_ff=cfg.d_ff,
        num_layers=cfg.num_layers,
        num_heads=cfg.num_heads,
        feed_forward_proj="gated-gelu",
        tie_word_embeddings=False,
    )
    return T5EncoderModel(config)


def _byte_tokenizer(vocab_size: int) -> "PreTrainedTokenizerBase":
    """ByT5's byte tokenizer needs no files, so random builds run anywhere (tests, CI, no network)."""
    from transformers import ByT5Tokenizer

    tokenizer = ByT5Tokenizer()
    if len(tokenizer) > vocab_size:
        # A ValueError, not an assert: asserts vanish under ``python -O``.
        raise ValueError(f"T5 vocab_size {vocab_size} < {len(tokenizer)} ids of the byte tokenizer")
    return tokenizer


def _load_t5(path: str, dtype: torch.dtype) -> tuple[nn.Module, "PreTrainedTokenizerBase", Path]:
    """T5 encoder + tokenizer from a model folder or a diffusers pipeline folder."""
    from transformers import AutoTokenizer, T5EncoderModel

    model_dir = find_folder(path, _T5_SUBFOLDERS, ("config.json",))
    # The tokenizer sits beside the weights (single-model folder), in the pipeline's tokenizer/, or
    # (some conversions) inside text_encoder/ itself.
    tok_subfolders = (*_TOKENIZER_SUBFOLDERS, *_T5_SUBFOLDERS)
    tok_dir = find_folder(path, tok_subfolders, _TOKENIZER_FILES)
    model, info = T5EncoderModel.from_pretrained(
        model_dir, local_files_only=True, dtype=dtype, output_loading_info=True
    )
    check_loading_info(info, model_dir, "T5")
    tokenizer = AutoTokenizer.from_pretrained(tok_dir, local_files_only=True)
    return model, tokenizer, model_dir
