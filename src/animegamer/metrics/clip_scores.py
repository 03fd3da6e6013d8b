"""CLIP-I and CLIP-T (Table 1: character and semantic consistency) with a transformers ``CLIPModel``.

* CLIP-I: mean cosine similarity between the CLIP image embeddings of the generated frames and the
  reference image(s) of the character (the ground-truth first frame, or reference frames): the mean
  over every (generated frame, reference image) pair. With one reference image this is the mean over
  generated frames of the cosine to that image.
* CLIP-T: mean cosine similarity between the generated frames and a text's CLIP text embedding;
  CLIP-T uses the turn's instruction, CLIP-T^E its environment text.

Raw cosines in [-1, 1] (no x100, no clamping at 0). Weights come from a local folder holding a full
CLIP model (vision + text towers, e.g. a copy of ``openai/clip-vit-large-patch14``) and its tokenizer,
loaded with ``local_files_only=True``; ``ClipScorer.random`` builds a tiny random model with a
file-less byte tokenizer for tests. Image preprocessing is ``FrozenClipVision.preprocess`` (shorter
side resized bicubic to the model's image size, center crop, CLIP mean/std), shared, not copied.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Sequence, Union

import numpy as np
import torch
import torch.nn.functional as F

from animegamer.models.frozen_base import check_loading_info, find_folder
from animegamer.models.frozen_clip import FrozenClipVision
from animegamer.utils.randomness import seeded

logger = logging.getLogger(__name__)
# transformers takes seconds to import: it is imported inside the functions that build a scorer or read
# its folder, so importing the metrics costs nothing until CLIP scores are computed.

ArrayLike = Union[np.ndarray, torch.Tensor]
_TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "tokenizer_config.json")


def _pooled(out) -> torch.Tensor:
    """transformers 5 returns BaseModelOutputWithPooling from get_*_features (4.x: a tensor)."""
    return out if isinstance(out, torch.Tensor) else out.pooler_output


def _as_frames(frames: ArrayLike) -> ArrayLike:
    """(H, W, 3) -> (1, H, W, 3); (N, H, W, 3) unchanged; checked for uint8 by the preprocessing."""
    if getattr(frames, "ndim", None) == 3:
        return frames[None]
    return frames


class ClipScorer:
    """A frozen CLIPModel + tokenizer that turns frames and texts into unit-norm embeddings."""

    def __init__(self, model, tokenizer, *, source: str = "", batch_size: int = 32) -> None:
        self.model = model.eval().requires_grad_(False)
        self.tokenizer = tokenizer
        self.image_size = int(model.config.vision_config.image_size)  # read by FrozenClipVision.preprocess
        self.max_text_tokens = int(model.config.text_config.max_position_embeddings)
        self.source = source
        self.batch_size = int(batch_size)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_pretrained(
        cls,
        path: str,
        *,
        device: Union[str, torch.device] = "cpu",
        dtype: torch.dtype = torch.float32,
        batch_size: int = 32,
    ) -> "ClipScorer":
        """Full CLIP model + tokenizer from a local folder (never the hub; FileNotFoundError if absent)."""
        from transformers import AutoTokenizer, CLIPModel

        folder = find_folder(path, (), ("config.json",))
        model_type = json.loads((folder / "config.json").read_text()).get("model_type")
        if model_type != "clip":
            raise ValueError(
                f"{folder} holds a {model_type!r} model; CLIP-I/CLIP-T need a full CLIP model folder "
                "(model_type 'clip': vision and text towers with projections)"
            )
        model, info = CLIPModel.from_pretrained(folder, local_files_only=True, dtype=dtype, output_loading_info=True)
        check_loading_info(info, folder, "CLIP scorer")
        tok_dir = find_folder(str(folder), ("tokenizer",), _TOKENIZER_FILES)
        tokenizer = AutoTokenizer.from_pretrained(tok_dir, local_files_only=True)
        _warn_if_other_normalisation(folder)
        scorer = cls(model, tokenizer, source=str(folder), batch_size=batch_size)
        return scorer.to(device)

    @classmethod
    def random(
        cls,
        *,
        seed: int = 0,
        hidden_size: int = 32,
        intermediate_size: int = 64,
        num_layers: int = 2,
        num_heads: int = 4,
        projection_dim: int = 16,
        image_size: int = 32,
        patch_size: int = 8,
        max_text_tokens: int = 64,
        batch_size: int = 32,
    ) -> "ClipScorer":
        """Tiny random CLIP (same seed, same weights) with ByT5's file-less byte tokenizer."""
        from transformers import ByT5Tokenizer, CLIPConfig, CLIPModel

        tokenizer = ByT5Tokenizer()
        tower = dict(
            hidden_size=hidden_size,
            intermediate_size=intermediate_size,
            num_hidden_layers=num_layers,
            num_attention_heads=num_heads,
        )
        config = CLIPConfig(
            # CLIP's text tower pools the hidden state at the first eos_token_id: it must be the
            # tokenizer's eos (ByT5: 1, appended after truncation), not CLIP's default 49407.
            text_config=dict(
                tower,
                vocab_size=len(tokenizer),
                max_position_embeddings=max_text_tokens,
                eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id,
                bos_token_id=None,
            ),
            vision_config=dict(tower, image_size=image_size, patch_size=patch_size),
            projection_dim=projection_dim,
        )
        with seeded(seed):
            model = CLIPModel(config)
        return cls(model, tokenizer, source=f"random(seed={seed})", batch_size=batch_size)

    def to(self, device: Union[str, torch.device]) -> "ClipScorer":
        self.model.to(device)
        return self

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    # ------------------------------------------------------------------ embeddings
    def preprocess(self, frames: ArrayLike) -> torch.Tensor:
        """uint8 (N, H, W, 3) -> float32 (N, 3, S, S): FrozenClipVision's CLIP preprocessing, shared."""
        return FrozenClipVision.preprocess(self, frames)  # uses only self.image_size

    @torch.no_grad()
    def image_embeddings(self, frames: ArrayLike) -> torch.Tensor:
        """uint8 frames (N, H, W, 3) (or one (H, W, 3) image) -> float32 (N, E) unit vectors, on CPU."""
        frames = _as_frames(frames)
        out = []
        for start in range(0, len(frames), self.batch_size):
            chunk = frames[start : start + self.batch_size]
            if isinstance(chunk, torch.Tensor):
                chunk = chunk.to(self.device)
            pixels = self.preprocess(chunk).to(device=self.device, dtype=self.dtype)
            out.append(_pooled(self.model.get_image_features(pixel_values=pixels)).float())
        if not out:
            raise ValueError("no frames to embed")
        return F.normalize(torch.cat(out), dim=-1).cpu()

    @torch.no_grad()
    def text_embeddings(self, texts: Sequence[str]) -> torch.Tensor:
        """Texts -> float32 (N, E) unit vectors, on CPU; truncated to the text tower's positions."""
        if isinstance(texts, str):
            raise TypeError("texts must be a list of strings, not one string")
        if not texts:
            raise ValueError("no texts to embed")
        batch = self.tokenizer(
            list(texts), padding=True, truncation=True, max_length=self.max_text_tokens, return_tensors="pt"
        )
        out = self.model.get_text_features(
            input_ids=batch["input_ids"].to(self.device), attention_mask=batch["attention_mask"].to(self.device)
        )
        return F.normalize(_pooled(out).float(), dim=-1).cpu()

    # ------------------------------------------------------------------ scores
    def clip_i(self, generated_frames: ArrayLike, reference_frames: ArrayLike) -> float:
        """Mean cosine over every (generated frame, reference image) pair; 1.0 for identical images."""
        gen = self.image_embeddings(generated_frames)  # (N, E)
        ref = self.image_embeddings(reference_frames)  # (M, E)
        return float((gen @ ref.T).mean())

    def clip_t(self, frames: ArrayLike, text: str) -> float:
        """Mean cosine between each frame and the text (instruction: CLIP-T; environment: CLIP-T^E)."""
        img = self.image_embeddings(frames)  # (N, E)
        txt = self.text_embeddings([text])  # (1, E)
        return float((img @ txt.T).mean())


def try_load_clip(
    path: str, *, device: Union[str, torch.device] = "cpu", dtype: torch.dtype = torch.float32
) -> tuple[ClipScorer | None, str]:
    """(scorer, "") or (None, reason) when no weights are configured / present.

    Only *missing* weights make the metric unavailable; a folder holding the wrong model or broken
    weights raises, so a misconfigured evaluation fails before it spends hours generating.
    """
    if not path:
        return None, "no CLIP weights configured"
    if not Path(path).expanduser().exists():
        return None, f"CLIP weights folder {path} not found"
    try:
        return ClipScorer.from_pretrained(path, device=device, dtype=dtype), ""
    except FileNotFoundError as exc:
        return None, f"CLIP weights incomplete: {exc}"


def _warn_if_other_normalisation(folder: Path) -> None:
    """Preprocessing uses OpenAI CLIP mean/std; say so if the folder's processor asks for others."""
    from transformers.utils.constants import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD

    config = folder / "preprocessor_config.json"
    if not config.is_file():
        return
    data = json.loads(config.read_text())
    for key, expected in (("image_mean", OPENAI_CLIP_MEAN), ("image_std", OPENAI_CLIP_STD)):
        if key in data and not np.allclose(data[key], expected, atol=1e-6):
            logger.warning("%s: %s=%s differs from CLIP's %s used here", config, key, data[key], list(expected))
