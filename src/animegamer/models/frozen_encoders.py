"""Frozen encoders of AnimeGamer: T5 v1.1 (motion text), CLIP ViT (first frame), CogVideoX 3-D VAE.

Each encoder either loads weights from a local Hugging Face / diffusers folder (``cfg.path``, never a
hub download: ``local_files_only=True`` everywhere, never ``trust_remote_code``) or, when the path is
empty, builds random weights of the configured sizes. Random builds are seeded so that two processes
(the precompute stage and a training run, two ranks, a test and its rerun) build the same model; the
seed is applied inside a forked RNG so building an encoder never disturbs the caller's random stream,
and each encoder reseeds on its own so building one alone gives the same weights as building all three.

The modules stay frozen: parameters never require grad and ``train()`` is a no-op, because a parent
LightningModule calls ``.train()`` recursively and T5's dropout would otherwise switch on silently.
Outputs are computed under ``torch.no_grad`` (not ``inference_mode``: inference tensors cannot be
saved for backward, and training steps may feed these features straight into trainable layers).
"""
from __future__ import annotations

import logging
import math
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Sequence, Union

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from animegamer.config.schema import ClipVisionConfig, EncodersConfig, T5Config, VAEConfig
from animegamer.utils.randomness import seeded

if TYPE_CHECKING:  # heavy imports stay inside the functions that need them
    from transformers import PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

ArrayLike = Union[np.ndarray, torch.Tensor]
ENCODER_NAMES = ("t5", "clip", "vae")

# Folder names of the diffusers pipeline layout, tried after the folder itself.
_T5_SUBFOLDERS = ("text_encoder",)
_TOKENIZER_SUBFOLDERS = ("tokenizer",)
_CLIP_SUBFOLDERS = ("image_encoder",)
_VAE_SUBFOLDERS = ("vae",)
_TOKENIZER_FILES = ("tokenizer_config.json", "tokenizer.json", "spiece.model")
_COGVIDEOX_DOWN_BLOCK = "CogVideoXDownBlock3D"
_COGVIDEOX_UP_BLOCK = "CogVideoXUpBlock3D"


# --------------------------------------------------------------------------- shared helpers
def _find_folder(path: str, subfolders: Sequence[str], marker_files: Sequence[str]) -> Path:
    """Return ``path`` or its first pipeline-layout subfolder that holds one of ``marker_files``.

    Accepting both layouts means a single-model folder (``t5-v1_1-xxl/``) and a whole diffusers
    pipeline folder (``CogVideoX-2b/`` with ``text_encoder/``, ``tokenizer/``, ``vae/``) both work.
    """
    root = Path(path).expanduser()
    candidates = [root, *(root / name for name in subfolders)]
    for folder in candidates:
        if any((folder / marker).is_file() for marker in marker_files):
            return folder
    tried = ", ".join(str(c) for c in candidates)
    raise FileNotFoundError(f"none of {list(marker_files)} found in: {tried}")


def _resolve_path(path: str, random_if_missing: bool, what: str) -> str:
    """Return the folder to load, or "" for a random build.

    A configured folder that does not exist is an error by default: silently training against random
    "frozen" features would waste a whole run. ``random_if_missing`` is for benchmarks only.
    """
    if not path or Path(path).expanduser().exists():
        return path
    if random_if_missing:
        logger.warning("%s: folder %s does not exist; building RANDOM weights instead", what, path)
        return ""
    raise FileNotFoundError(f"{what}: weights folder {path!r} does not exist (set path: '' for random weights)")


def _check_loading_info(info: dict, folder: Path, what: str) -> None:
    """Fail on missing weights: transformers would otherwise initialise them randomly, and quietly."""
    missing = list(info.get("missing_keys") or [])
    if missing:
        raise RuntimeError(f"{what}: {len(missing)} weights missing in {folder}, e.g. {missing[:5]}")


def _as_uint8_tensor(x: ArrayLike, ndim: int, layout: str) -> torch.Tensor:
    """Accept numpy or torch uint8 pixels with a trailing RGB axis; anything else is a caller bug."""
    t = torch.from_numpy(np.ascontiguousarray(x)) if isinstance(x, np.ndarray) else x
    if not isinstance(t, torch.Tensor) or t.dtype != torch.uint8 or t.ndim != ndim or t.shape[-1] != 3:
        shape = tuple(getattr(x, "shape", ()))
        dtype = getattr(x, "dtype", type(x))
        raise ValueError(f"expected uint8 {layout} with 3 channels, got {dtype} of shape {shape}")
    return t


def count_parameters(module: nn.Module) -> int:
    """Number of distinct parameters (tied weights counted once); works on meta tensors too."""
    return sum(p.numel() for p in module.parameters())


class _FrozenModule(nn.Module):
    """Base of the frozen wrappers: no grads, always eval, device/dtype read off the weights."""

    from_disk: bool = False
    source: str = ""

    def _freeze(self) -> None:
        self.requires_grad_(False)
        super().train(False)

    def train(self, mode: bool = True) -> "_FrozenModule":
        """Ignore ``mode``: a parent's ``.train()`` must not re-enable dropout in a frozen encoder."""
        return super().train(False)

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype


# --------------------------------------------------------------------------- T5
class FrozenT5(_FrozenModule):
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
        path = _resolve_path(cfg.path, random_if_missing, "T5")
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

    model_dir = _find_folder(path, _T5_SUBFOLDERS, ("config.json",))
    # The tokenizer sits beside the weights (single-model folder), in the pipeline's tokenizer/, or
    # (some conversions) inside text_encoder/ itself.
    tok_subfolders = (*_TOKENIZER_SUBFOLDERS, *_T5_SUBFOLDERS)
    tok_dir = _find_folder(path, tok_subfolders, _TOKENIZER_FILES)
    model, info = T5EncoderModel.from_pretrained(
        model_dir, local_files_only=True, dtype=dtype, output_loading_info=True
    )
    _check_loading_info(info, model_dir, "T5")
    tokenizer = AutoTokenizer.from_pretrained(tok_dir, local_files_only=True)
    return model, tokenizer, model_dir


# --------------------------------------------------------------------------- CLIP
class FrozenClipVision(_FrozenModule):
    """CLIP ViT vision tower: penultimate-layer patch tokens, CLS dropped (paper: 196 x 768).

    The penultimate layer (``hidden_states[-2]``) is used because the last block is tuned towards
    the pooled contrastive embedding and carries less spatial detail (as in LLaVA/IP-Adapter).
    """

    def __init__(
        self,
        cfg: ClipVisionConfig,
        *,
        seed: int = 0,
        dtype: torch.dtype = torch.float32,
        random_if_missing: bool = False,
    ) -> None:
        super().__init__()
        path = _resolve_path(cfg.path, random_if_missing, "CLIP")
        if path:
            self.model, folder = _load_clip(path, dtype)
            self.from_disk, self.source = True, str(folder)
        else:
            with seeded(seed):
                self.model = _random_clip(cfg)
            self.from_disk, self.source = False, f"random(seed={seed})"
        self.to(dtype)  # random builds are made in float32 first, so every dtype rounds the same weights
        self.image_size = int(self.model.config.image_size)
        self.patch_size = int(self.model.config.patch_size)
        self._freeze()
        logger.info("CLIP vision: %s, %d params", self.source, count_parameters(self.model))

    @property
    def hidden_size(self) -> int:
        return int(self.model.config.hidden_size)

    @property
    def num_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    def preprocess(self, frames: ArrayLike) -> torch.Tensor:
        """uint8 (B, H, W, 3) -> float32 (B, 3, S, S), as CLIPImageProcessor (PIL backend) does it.

        Shorter side resized to S (bicubic), center crop, [0, 1], CLIP mean/std. Runs on the frames'
        device (so on GPU for GPU tensors) and agrees with PIL to one uint8 level, see _pil_bicubic.
        """
        s = self.image_size
        x = _as_uint8_tensor(frames, 4, "(B, H, W, 3)").permute(0, 3, 1, 2).float()  # (B, 3, H, W)
        new_h, new_w = _shortest_edge_size(x.shape[-2], x.shape[-1], s)
        x = _pil_bicubic(x, new_h, new_w)  # (B, 3, new_h, new_w), integer-valued in [0, 255]
        top, left = (new_h - s) // 2, (new_w - s) // 2  # CLIPImageProcessor's floor split
        x = x[..., top : top + s, left : left + s] / 255.0  # (B, 3, S, S)
        mean, std = _clip_mean_std(x.device)  # (1, 3, 1, 1) each, float32
        return (x - mean) / std

    @torch.no_grad()
    def encode(self, frames: ArrayLike) -> torch.Tensor:
        """uint8 frames (B, H, W, 3) -> (B, (S / patch)^2, hidden) penultimate-layer patch tokens."""
        frames = _as_uint8_tensor(frames, 4, "(B, H, W, 3)").to(self.device)
        pixels = self.preprocess(frames).to(self.dtype)
        out = self.model(pixel_values=pixels, output_hidden_states=True)
        tokens = out.hidden_states[-2]  # (B, 1 + N, hidden): CLS first
        return tokens[:, 1:]  # (B, N, hidden)

    forward = encode


def _clip_mean_std(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """CLIP's normalisation constants from transformers (never typed in), shaped (1, 3, 1, 1).

    Not buffers: a module-wide ``.to(bfloat16)`` would round them, and preprocessing stays float32.
    """
    from transformers.utils.constants import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD

    def as_tensor(values: Sequence[float]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.float32, device=device).view(1, 3, 1, 1)

    return as_tensor(OPENAI_CLIP_MEAN), as_tensor(OPENAI_CLIP_STD)


def _pil_bicubic(x: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """PIL's bicubic resize of uint8 images, in float on any device.

    torch's antialiased bicubic uses PIL's filter (a = -0.5, support scaled by the downscale
    factor); what differs is that PIL runs the horizontal pass, stores it as uint8 (clipping the
    overshoot and rounding), then runs the vertical pass. Two passes with the same rounding agree
    with PIL to one uint8 level; a single float pass is off by up to ~20 levels on sharp edges.
    """
    x = F.interpolate(x, size=(x.shape[-2], width), mode="bicubic", align_corners=False, antialias=True)
    x = x.clamp(0, 255).round()  # (B, C, H, width): PIL's uint8 intermediate image
    x = F.interpolate(x, size=(height, width), mode="bicubic", align_corners=False, antialias=True)
    return x.clamp(0, 255).round()  # (B, C, height, width)


def _shortest_edge_size(height: int, width: int, size: int) -> tuple[int, int]:
    """(h, w) with the shorter side = size and the longer one floored, as transformers computes it."""
    if height <= width:
        return size, int(size * width / height)
    return int(size * height / width), size


def _random_clip(cfg: ClipVisionConfig) -> nn.Module:
    """CLIP vision tower at the configured sizes; GELU as in OpenCLIP's laion2b ViT-B/16 (the paper's)."""
    from transformers import CLIPVisionConfig, CLIPVisionModel

    config = CLIPVisionConfig(
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads,
        image_size=cfg.image_size,
        patch_size=cfg.patch_size,
        hidden_act="gelu",
    )
    return CLIPVisionModel(config)


def _load_clip(path: str, dtype: torch.dtype) -> tuple[nn.Module, Path]:
    """CLIPVisionModel from a vision-only folder, a full CLIPModel folder or a pipeline's image_encoder/."""
    from transformers import CLIPVisionModel

    folder = _find_folder(path, _CLIP_SUBFOLDERS, ("config.json",))
    model, info = CLIPVisionModel.from_pretrained(
        folder, local_files_only=True, dtype=dtype, output_loading_info=True
    )
    _check_loading_info(info, folder, "CLIP")
    return model, folder


# --------------------------------------------------------------------------- VAE
class FrozenVAE(_FrozenModule):
    """CogVideoX 3-D VAE: uint8 video <-> scaled latents in the transformer's (B, T', C, H', W') layout.

    The scale factor is read from the model's own config: CogVideoX-2b uses 1.15258426 and 5b 0.7,
    so a schema default must never override what a loaded folder says.
    """

    def __init__(
        self,
        cfg: VAEConfig,
        *,
        seed: int = 0,
        dtype: torch.dtype = torch.float32,
        random_if_missing: bool = False,
    ) -> None:
        super().__init__()
        path = _resolve_path(cfg.path, random_if_missing, "VAE")
        if path:
            self.model, folder = _load_vae(path, dtype)
            self.from_disk, self.source = True, str(folder)
        else:
            with seeded(seed):
                self.model = _random_vae(cfg)
            self.from_disk, self.source = False, f"random(seed={seed})"
        # nn.Module.to on the wrapper, not ModelMixin.to (which warns about fp32-pinned modules it has none of).
        self.to(dtype)  # random builds are made in float32 first, so every dtype rounds the same weights
        if cfg.tiling:
            self.model.enable_tiling()
        self.cudnn_benchmark = cfg.cudnn_benchmark
        if cfg.channels_last:
            conv3d_memory_format(self.model, torch.channels_last_3d)
        if cfg.compile:  # in place: parameter names stay; only decoding plays at a fixed shape
            self.model.decoder.compile(dynamic=False)
        configured = int(self.model.config.temporal_compression_ratio)
        if self.temporal_compression != configured:
            logger.warning(
                "VAE temporal_compression_ratio=%d but %d blocks only compress time %dx",
                configured, len(self.model.config.block_out_channels), self.temporal_compression,
            )
        self._freeze()
        logger.info(
            "VAE: %s, %d params, scaling_factor %s, compression %dx%dx%d (t x h x w)",
            self.source, count_parameters(self.model), self.scaling_factor,
            self.temporal_compression, self.spatial_compression, self.spatial_compression,
        )

    # ---- geometry, all read off the model's config
    @property
    def spatial_compression(self) -> int:
        """Every block but the last halves H and W."""
        return 2 ** (len(self.model.config.block_out_channels) - 1)

    @property
    def temporal_compression(self) -> int:
        """The first log2(ratio) downsampling blocks also halve time; the last block never downsamples."""
        levels = int(math.log2(self.model.config.temporal_compression_ratio))
        return 2 ** min(levels, len(self.model.config.block_out_channels) - 1)

    @property
    def latent_channels(self) -> int:
        return int(self.model.config.latent_channels)

    @property
    def scaling_factor(self) -> float:
        return float(self.model.config.scaling_factor)

    @property
    def _shift_factor(self) -> float:
        # CogVideoX configs have none; honoured anyway so a folder that sets one is not misread.
        shift = getattr(self.model.config, "shift_factor", None)
        return float(shift) if shift is not None else 0.0

    def latent_shape(self, frames: int, height: int, width: int) -> tuple[int, int, int, int]:
        """(T', C, H', W') of a clip; CogVideoX keeps the first frame alone: T' = (T - 1) / 4 + 1."""
        tc, sc = self.temporal_compression, self.spatial_compression
        if frames < 1 or (frames - 1) % tc:
            raise ValueError(f"frames must be {tc}k + 1, got {frames}")
        if height % sc or width % sc:
            raise ValueError(f"height and width must be multiples of {sc}, got {height}x{width}")
        return (frames - 1) // tc + 1, self.latent_channels, height // sc, width // sc

    # ---- encode / decode
    @torch.no_grad()
    def encode(self, video: ArrayLike, sample_seed: int | None = None) -> torch.Tensor:
        """uint8 (B, T, H, W, 3) -> scaled latents (B, T', C, H', W').

        ``sample_seed=None`` takes the posterior mode (deterministic, the default for precomputed
        features); an int draws a posterior sample from a CPU generator with that seed, so the
        draw is the same on every device.
        """
        v = _as_uint8_tensor(video, 5, "(B, T, H, W, 3)")
        expected = self.latent_shape(v.shape[1], v.shape[2], v.shape[3])
        x = v.to(self.device).permute(0, 4, 1, 2, 3)  # (B, 3, T, H, W)
        x = (x.float() / 127.5 - 1.0).to(self.dtype)  # [0, 255] -> [-1, 1], scaled in float32
        dist = self.model.encode(x).latent_dist
        if sample_seed is None:
            z = dist.mode()
        else:
            z = dist.sample(generator=torch.Generator(device="cpu").manual_seed(sample_seed))
        z = (z - self._shift_factor) * self.scaling_factor  # (B, C, T', H', W')
        z = z.permute(0, 2, 1, 3, 4).contiguous()  # (B, T', C, H', W')
        if tuple(z.shape[1:]) != expected:
            raise RuntimeError(f"VAE produced latents {tuple(z.shape[1:])}, geometry says {expected}")
        return z

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Scaled latents (B, T', C, H', W') -> float video (B, T, H, W, 3) in [0, 1]."""
        if latents.ndim != 5:
            raise ValueError(f"expected latents (B, T', C, H', W'), got shape {tuple(latents.shape)}")
        z = latents.to(device=self.device, dtype=self.dtype).permute(0, 2, 1, 3, 4)  # (B, C, T', H', W')
        z = z / self.scaling_factor + self._shift_factor
        with _cudnn_benchmark(self.cudnn_benchmark):
            x = self.model.decode(z).sample  # (B, 3, T, H, W) in about [-1, 1]
        x = ((x.float() + 1.0) / 2.0).clamp(0.0, 1.0)
        return x.permute(0, 2, 3, 4, 1)  # (B, T, H, W, 3)

    forward = encode


def conv3d_memory_format(model: nn.Module, memory_format: torch.memory_format) -> None:
    """The 3-D convolutions' weights in ``memory_format``; cuDNN lays their outputs out the same way. Only
    these: the VAE's upsamplers also hold 2-D convolutions, which channels_last_3d does not apply to."""
    for module in model.modules():
        if isinstance(module, nn.Conv3d):
            module.weight.data = module.weight.data.contiguous(memory_format=memory_format)


@contextmanager
def _cudnn_benchmark(enabled: bool) -> Iterator[None]:
    """cuDNN's algorithm search switched on inside the block when ``enabled`` (restored after). The flag is
    process-wide: decodes running at the same time on other threads see it too."""
    previous = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = previous or enabled
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark = previous


def _random_vae(cfg: VAEConfig) -> nn.Module:
    """CogVideoX VAE at the configured sizes; block type lists must match ``block_out_channels``."""
    from diffusers import AutoencoderKLCogVideoX

    channels = tuple(int(c) for c in cfg.block_out_channels)
    return AutoencoderKLCogVideoX(
        down_block_types=(_COGVIDEOX_DOWN_BLOCK,) * len(channels),
        up_block_types=(_COGVIDEOX_UP_BLOCK,) * len(channels),
        block_out_channels=channels,
        layers_per_block=cfg.layers_per_block,
        latent_channels=cfg.latent_channels,
        norm_num_groups=cfg.norm_num_groups,
        temporal_compression_ratio=cfg.temporal_compression_ratio,
        scaling_factor=cfg.scaling_factor,
    )


def _load_vae(path: str, dtype: torch.dtype) -> tuple[nn.Module, Path]:
    """AutoencoderKLCogVideoX from a VAE folder or a pipeline folder's vae/."""
    from diffusers import AutoencoderKLCogVideoX

    folder = _find_folder(path, _VAE_SUBFOLDERS, ("config.json",))
    # diffusers raises on missing weights itself (low_cpu_mem_usage loading).
    model = AutoencoderKLCogVideoX.from_pretrained(folder, local_files_only=True, torch_dtype=dtype)
    return model, folder


# --------------------------------------------------------------------------- all three
@dataclass
class FrozenEncoders:
    """The frozen encoders one stage asked for; the others stay None."""

    t5: FrozenT5 | None = None
    clip: FrozenClipVision | None = None
    vae: FrozenVAE | None = None


def build_frozen_encoders(
    cfg: EncodersConfig,
    device: Union[str, torch.device] = "cpu",
    dtype: torch.dtype = torch.float32,
    which: Sequence[str] = ENCODER_NAMES,
    random_if_missing: bool = False,
) -> FrozenEncoders:
    """Build the encoders named in ``which``, frozen, in eval mode, on ``device`` in ``dtype``.

    Random builds use ``cfg.seed``. ``random_if_missing`` turns a configured-but-absent folder into
    a random build (benchmarks on machines without checkpoints); off by default, see _resolve_path.
    """
    if isinstance(which, str):
        which = (which,)
    unknown = sorted(set(which) - set(ENCODER_NAMES))
    if unknown:
        raise ValueError(f"unknown encoders {unknown}; choose from {ENCODER_NAMES}")
    classes = {"t5": (FrozenT5, cfg.t5), "clip": (FrozenClipVision, cfg.clip), "vae": (FrozenVAE, cfg.vae)}
    built: dict[str, _FrozenModule] = {}
    for name in ENCODER_NAMES:
        if name not in which:
            continue
        cls, sub_cfg = classes[name]
        encoder = cls(sub_cfg, seed=cfg.seed, dtype=dtype, random_if_missing=random_if_missing)
        encoder.to(device=device, dtype=dtype)
        encoder.eval()
        encoder.requires_grad_(False)
        built[name] = encoder
    loaded = [n for n, e in built.items() if e.from_disk]
    random = [n for n, e in built.items() if not e.from_disk]
    logger.info("frozen encoders: loaded from disk %s, random %s (seed %d)", loaded, random, cfg.seed)
    return FrozenEncoders(**built)
