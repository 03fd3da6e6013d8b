"""The action-aware multimodal encoder E(text, image) -> N x D of AnimeGamer.

Two branches map frozen features into the representation space the decoder reads as its "text"
stream: the motion text's T5 features and the first frame's CLIP patch tokens, each through
Linear-GELU-Linear then LayerNorm. The official network concatenates the two token sets, text
first (N = 30 + 196 = 226 at paper scale); the other fusions exist for the paper's ablations.

Fusion variants (``cfg.fusion``):

- ``concat`` (default, the official network): ``[text ; image]`` along tokens, N = Lt + Li.
- ``add``: the token counts differ (30 vs 196), so element-wise addition is defined as
  ``image_tokens + mean(text_tokens)`` broadcast over the image tokens, N = Li. The mean keeps the
  motion text's content without inventing an alignment between words and patches.
- ``cross_attention``: the image tokens attend to the text tokens (one ``nn.MultiheadAttention``
  with a residual connection), then the text tokens are concatenated in front as in ``concat``, so
  N = Lt + Li and the decoder's token count does not depend on the ablation.

``cfg.mlp = False`` replaces each branch's Linear-GELU-Linear by a single Linear (the "less
params" ablation). The official checkpoint also holds ``output_mix_layer_norm``; the golden case
shows it is not on the path of either output (it is built by the official code but never used),
so the encoder has no module for it and the importer reports it as a known-unused key.
"""
from __future__ import annotations

import logging

import torch
from torch import nn

from animegamer.config.schema import ActionEncoderConfig
from animegamer.config.validate import choice

logger = logging.getLogger(__name__)

FUSION_CONCAT = "concat"
FUSION_ADD = "add"
FUSION_CROSS_ATTENTION = "cross_attention"
FUSIONS = (FUSION_CONCAT, FUSION_ADD, FUSION_CROSS_ATTENTION)

# The official encoder MLPs use the exact (erf) GELU, unlike the transformer's feed-forward (tanh):
# the golden case is matched bit for bit with "none" and only to ~3e-7 with "tanh".
GELU_APPROXIMATION = "none"


def representation_tokens(cfg: ActionEncoderConfig) -> int:
    """N for a config, without building the encoder (the MLLM's query count depends on it)."""
    return cfg.image_tokens if cfg.fusion == FUSION_ADD else cfg.text_tokens + cfg.image_tokens


def check_encoder_config(cfg: ActionEncoderConfig) -> list[str]:
    """``model.encoder``'s choices, before anything is built."""
    return choice("model.encoder.fusion", cfg.fusion, FUSIONS)


def _branch_projection(in_dim: int, width: int, mlp: bool) -> nn.Module:
    """Linear-GELU-Linear (indices 0 and 2, as in the official state dict) or one Linear.

    The Sequential keeps the official layout (``proj.0``, ``proj.2``) so the importer maps keys
    one to one; the single Linear is the ablation and never meets an official checkpoint.
    """
    if not mlp:
        return nn.Linear(in_dim, width)
    return nn.Sequential(nn.Linear(in_dim, width), nn.GELU(approximate=GELU_APPROXIMATION), nn.Linear(width, width))


class ActionAwareEncoder(nn.Module):
    """E(text, image) -> (B, N, D): motion-text and first-frame features fused into N tokens.

    Modules: ``text_proj`` + ``text_norm`` (official ``text_proj`` / ``txt_mix_layer_norm``),
    ``image_proj`` + ``image_norm`` (official ``ip_proj`` / ``ip_mix_layer_norm``), and for the
    cross-attention ablation ``cross_attention``.
    """

    def __init__(self, cfg: ActionEncoderConfig) -> None:
        super().__init__()
        if cfg.fusion not in FUSIONS:
            raise ValueError(f"encoder fusion must be one of {FUSIONS}, got {cfg.fusion!r}")
        self.cfg = cfg
        width = cfg.width
        self.text_proj = _branch_projection(cfg.text_dim, width, cfg.mlp)
        self.text_norm = nn.LayerNorm(width, eps=cfg.layernorm_eps)
        self.image_proj = _branch_projection(cfg.image_dim, width, cfg.mlp)
        self.image_norm = nn.LayerNorm(width, eps=cfg.layernorm_eps)
        self.cross_attention: nn.MultiheadAttention | None = None
        if cfg.fusion == FUSION_CROSS_ATTENTION:
            if width % cfg.cross_attention_heads:
                raise ValueError(f"encoder width {width} is not divisible by {cfg.cross_attention_heads} heads")
            self.cross_attention = nn.MultiheadAttention(width, cfg.cross_attention_heads, batch_first=True)
        logger.debug("action encoder: fusion %s, %s branches, %d tokens of width %d",
                     cfg.fusion, "MLP" if cfg.mlp else "Linear", self.num_tokens, width)

    @property
    def width(self) -> int:
        """D, the representation width (the decoder's hidden size)."""
        return self.cfg.width

    @property
    def num_tokens(self) -> int:
        """N, the number of representation tokens this fusion produces."""
        return representation_tokens(self.cfg)

    def unconditional(self) -> torch.Tensor:
        """(1, N, D): the representation of zero text and image features, the classifier-free guidance
        branch (SAT's unconditional), computed on the encoder's device in its weights' dtype."""
        param = next(self.parameters())
        cfg = self.cfg
        text = torch.zeros(1, cfg.text_tokens, cfg.text_dim, device=param.device, dtype=param.dtype)
        image = torch.zeros(1, cfg.image_tokens, cfg.image_dim, device=param.device, dtype=param.dtype)
        return self(text, image)

    def encode_text(self, text: torch.Tensor) -> torch.Tensor:
        """(B, Lt, text_dim) -> (B, Lt, D)."""
        return self.text_norm(self.text_proj(text))

    def encode_image(self, image: torch.Tensor) -> torch.Tensor:
        """(B, Li, image_dim) -> (B, Li, D)."""
        return self.image_norm(self.image_proj(image))

    def forward(self, text: torch.Tensor, image: torch.Tensor) -> torch.Tensor:
        """text (B, Lt, text_dim), image (B, Li, image_dim) -> (B, N, D), text tokens first."""
        self._check_inputs(text, image)
        text_tokens = self.encode_text(text)
        image_tokens = self.encode_image(image)
        if self.cfg.fusion == FUSION_ADD:
            # (B, Li, D) + (B, 1, D): the text summary is added to every image token.
            return image_tokens + text_tokens.mean(dim=1, keepdim=True)
        if self.cross_attention is not None:
            attended, _ = self.cross_attention(image_tokens, text_tokens, text_tokens, need_weights=False)
            image_tokens = image_tokens + attended
        return torch.cat([text_tokens, image_tokens], dim=1)  # (B, Lt + Li, D)

    def _check_inputs(self, text: torch.Tensor, image: torch.Tensor) -> None:
        """Fail with both shapes named: a wrong feature width otherwise surfaces deep in a matmul."""
        if text.ndim != 3 or text.shape[-1] != self.cfg.text_dim:
            raise ValueError(f"text features must be (B, Lt, {self.cfg.text_dim}), got {tuple(text.shape)}")
        if image.ndim != 3 or image.shape[-1] != self.cfg.image_dim:
            raise ValueError(f"image features must be (B, Li, {self.cfg.image_dim}), got {tuple(image.shape)}")
        if text.shape[0] != image.shape[0]:
            raise ValueError(f"batch sizes differ: text {text.shape[0]}, image {image.shape[0]}")
