"""Frozen encoders (T5, CLIP vision, CogVideoX VAE) at the tiny preset: CPU, a few seconds in all.

Paper sizes are checked on the meta device, so their parameter counts are verified without
allocating a byte of weights.
"""
from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from torch.utils.flop_counter import FlopCounterMode

from animegamer.config.compose import config_dir
from animegamer.config.schema import EncodersConfig, ModelConfig
from animegamer.models.frozen_base import count_parameters
from animegamer.models.frozen_clip import FrozenClipVision
from animegamer.models.frozen_encoders import FrozenEncoders, build_frozen_encoders
from animegamer.models.frozen_t5 import FrozenT5
from animegamer.models.frozen_vae import FrozenVAE

REPO = Path(__file__).resolve().parents[1]
CLIP_FRAMES, CLIP_HEIGHT, CLIP_WIDTH = 17, 96, 144  # one tiny-preset clip
SMALL_VIDEO = (1, 5, 32, 48)  # (B, T, H, W): enough for equality checks, cheap for the VAE

# Exact parameter counts of the paper's encoders (verified on the meta device by the test below).
T5_XXL_ENCODER_PARAMS = 4_762_310_656
CLIP_B16_VISION_PARAMS = 85_799_424
COGVIDEOX_VAE_PARAMS = 215_583_907
# Bounds on the floating-point operations of one tiny clip, which keep its encoding under a second of
# one CPU core (the counts and times measured: benchmarks/README.md, 'Numbers behind comments').
TINY_ENCODE_FLOPS = 4e9
TINY_DECODE_FLOPS = 1e10

logger = logging.getLogger(__name__)


# --------------------------------------------------------------------------- fixtures and helpers
def load_encoders_config(preset: str) -> EncodersConfig:
    """model/<preset>.yaml of the config folder merged into the schema, as Hydra composes it, as dataclasses."""
    raw = OmegaConf.load(config_dir() / "model" / f"{preset}.yaml")
    raw.pop("defaults", None)  # Hydra's defaults list; the schema below is what it names
    merged = OmegaConf.merge(OmegaConf.structured(ModelConfig), raw)
    return OmegaConf.to_object(merged).encoders


def random_video(shape: tuple[int, int, int, int], seed: int = 0) -> np.ndarray:
    """uint8 (B, T, H, W, 3)."""
    return np.random.default_rng(seed).integers(0, 256, (*shape, 3), dtype=np.uint8)


def with_path(cfg, path: Path | str):
    return dataclasses.replace(cfg, path=str(path))


def assert_same_weights(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for key in sa:
        assert torch.equal(sa[key], sb[key]), key


@pytest.fixture(scope="module")
def tiny_cfg() -> EncodersConfig:
    return load_encoders_config("tiny")


@pytest.fixture(scope="module")
def tiny(tiny_cfg: EncodersConfig) -> FrozenEncoders:
    return build_frozen_encoders(tiny_cfg)


@pytest.fixture(scope="module")
def clip_video() -> np.ndarray:
    return random_video((1, CLIP_FRAMES, CLIP_HEIGHT, CLIP_WIDTH))


# --------------------------------------------------------------------------- T5
def test_t5_output_shape_truncation_and_padding(tiny: FrozenEncoders, tiny_cfg: EncodersConfig) -> None:
    texts = ["softly talk", "", "run " * 100]
    out = tiny.t5.encode(texts)
    assert out.shape == (3, tiny_cfg.t5.max_tokens, tiny_cfg.t5.d_model)
    assert out.dtype == torch.float32 and not out.requires_grad and torch.isfinite(out).all()
    ids, mask = tiny.t5.tokenize(texts)
    eos = tiny.t5.tokenizer.eos_token_id
    assert mask[0].sum() == len("softly talk") + 1  # bytes + </s>
    assert mask[1].sum() == 1  # just </s>
    assert mask[2].all() and ids[2, -1] == eos  # truncated, </s> kept


def test_t5_attention_mask_switch(tiny: FrozenEncoders) -> None:
    """Masked: real tokens equal a forward of the unpadded sequence. Default (CogVideoX): unmasked."""
    assert tiny.t5.attention_mask is False
    out = tiny.t5.encode(["softly talk"], use_attention_mask=True)
    ids, mask = tiny.t5.tokenize(["softly talk"])
    n = int(mask.sum())
    with torch.no_grad():
        unpadded = tiny.t5.model(input_ids=ids[:, :n]).last_hidden_state  # (1, n, d_model)
    torch.testing.assert_close(out[:, :n], unpadded, rtol=1e-5, atol=1e-5)
    unmasked = tiny.t5.encode(["softly talk"])
    assert not torch.allclose(unmasked[:, :n], unpadded, atol=1e-4)
    with torch.no_grad():
        torch.testing.assert_close(unmasked, tiny.t5.model(input_ids=ids).last_hidden_state)


def test_t5_rejects_a_bare_string(tiny: FrozenEncoders) -> None:
    with pytest.raises(TypeError):
        tiny.t5.encode("softly talk")


def test_t5_vocab_must_hold_the_byte_tokenizer(tiny_cfg: EncodersConfig) -> None:
    with pytest.raises(ValueError, match="vocab_size"):
        FrozenT5(dataclasses.replace(tiny_cfg.t5, vocab_size=300))


# --------------------------------------------------------------------------- CLIP
def test_clip_output_shape(tiny: FrozenEncoders, tiny_cfg: EncodersConfig, clip_video: np.ndarray) -> None:
    cfg = tiny_cfg.clip
    patches = (cfg.image_size // cfg.patch_size) ** 2
    frames = clip_video[0]  # (T, H, W, 3): every frame of the clip as a batch
    out = tiny.clip.encode(frames)
    assert out.shape == (CLIP_FRAMES, patches, cfg.hidden_size) == (CLIP_FRAMES, tiny.clip.num_patches, 32)
    torch.testing.assert_close(tiny.clip.encode(torch.from_numpy(frames)), out)


def test_clip_uses_the_penultimate_layer_without_cls(tiny: FrozenEncoders, clip_video: np.ndarray) -> None:
    frames = clip_video[0, :2]
    with torch.no_grad():
        hidden = tiny.clip.model(pixel_values=tiny.clip.preprocess(frames), output_hidden_states=True).hidden_states
    out = tiny.clip.encode(frames)
    torch.testing.assert_close(out, hidden[-2][:, 1:])
    assert not torch.allclose(out, hidden[-1][:, 1:])


def _reference_image_processor(size: int):
    """transformers' CLIP preprocessing with PIL (the original), or the default backend if absent."""
    from transformers.image_utils import PILImageResampling

    try:
        from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil as Processor
    except ImportError:  # transformers without a separate PIL backend
        from transformers import CLIPImageProcessor as Processor
    return Processor(
        do_resize=True, size={"shortest_edge": size}, crop_size=size, resample=PILImageResampling.BICUBIC
    )


@pytest.mark.parametrize(
    "size, height, width",
    [(32, 96, 144), (224, 480, 720), (224, 300, 200), (224, 150, 180), (32, 37, 53), (224, 224, 224)],
    ids=["tiny-down3x", "paper-480x720", "portrait", "upscale", "odd-sizes", "identity"],
)
def test_clip_preprocess_matches_clip_image_processor(
    tiny_cfg: EncodersConfig, size: int, height: int, width: int
) -> None:
    """Within one uint8 level of transformers' (PIL) bicubic pipeline, on worst-case noise."""
    from transformers.utils.constants import OPENAI_CLIP_STD

    clip = FrozenClipVision(dataclasses.replace(tiny_cfg.clip, image_size=size))
    frames = random_video((3, height, width))
    expected = _reference_image_processor(size)(list(frames), return_tensors="pt").pixel_values
    ours = clip.preprocess(frames)
    assert ours.shape == expected.shape == (3, 3, size, size)
    diff = (ours - expected).abs()
    one_level = 1.0 / (255.0 * min(OPENAI_CLIP_STD))  # 0.0150
    logger.info(
        "CLIP preprocess %dx%d -> %d: max abs diff %.5f, mean %.6f", height, width, size, diff.max(), diff.mean()
    )
    assert diff.max() <= one_level + 1e-5
    assert diff.mean() < 1e-3  # nearly every pixel is identical


def test_clip_rejects_float_frames(tiny: FrozenEncoders) -> None:
    with pytest.raises(ValueError, match="uint8"):
        tiny.clip.encode(np.zeros((1, 32, 32, 3), dtype=np.float32))


# --------------------------------------------------------------------------- VAE
def test_vae_encode_decode_shapes(tiny: FrozenEncoders, tiny_cfg: EncodersConfig, clip_video: np.ndarray) -> None:
    vae = tiny.vae
    latents = vae.encode(clip_video)
    expected = vae.latent_shape(CLIP_FRAMES, CLIP_HEIGHT, CLIP_WIDTH)
    assert latents.shape == (1, *expected)
    assert expected[1] == vae.latent_channels == tiny_cfg.vae.latent_channels
    assert vae.scaling_factor == pytest.approx(tiny_cfg.vae.scaling_factor)
    video = vae.decode(latents)
    assert video.shape == (1, CLIP_FRAMES, CLIP_HEIGHT, CLIP_WIDTH, 3)
    assert video.dtype == torch.float32 and video.min() >= 0.0 and video.max() <= 1.0


def test_vae_mode_is_default_and_samples_are_seeded(tiny: FrozenEncoders) -> None:
    video = random_video(SMALL_VIDEO)
    mode = tiny.vae.encode(video)
    torch.testing.assert_close(tiny.vae.encode(video), mode, rtol=0, atol=0)
    sample = tiny.vae.encode(video, sample_seed=3)
    torch.testing.assert_close(tiny.vae.encode(video, sample_seed=3), sample, rtol=0, atol=0)
    assert not torch.equal(sample, mode)
    assert not torch.equal(tiny.vae.encode(video, sample_seed=4), sample)


def test_vae_latent_shape_checks_geometry(tiny: FrozenEncoders) -> None:
    tc, sc = tiny.vae.temporal_compression, tiny.vae.spatial_compression
    assert tiny.vae.latent_shape(4 * tc + 1, 8 * sc, 12 * sc) == (5, tiny.vae.latent_channels, 8, 12)
    with pytest.raises(ValueError):
        tiny.vae.latent_shape(tc + 2, 8 * sc, 8 * sc)
    with pytest.raises(ValueError):
        tiny.vae.latent_shape(tc + 1, 8 * sc + 1, 8 * sc)


def test_vae_tiling_follows_the_config(tiny_cfg: EncodersConfig) -> None:
    assert not FrozenVAE(tiny_cfg.vae).model.use_tiling
    assert FrozenVAE(dataclasses.replace(tiny_cfg.vae, tiling=True)).model.use_tiling


def test_vae_cudnn_benchmark_is_on_during_decode_only_when_configured(tiny_cfg: EncodersConfig, monkeypatch) -> None:
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)  # whatever an earlier test left
    for enabled in (False, True):
        vae = FrozenVAE(dataclasses.replace(tiny_cfg.vae, cudnn_benchmark=enabled))
        seen, decode = [], vae.model.decode
        vae.model.decode = lambda z: (seen.append(torch.backends.cudnn.benchmark), decode(z))[1]
        before = torch.backends.cudnn.benchmark
        video = vae.decode(torch.zeros(1, 2, vae.latent_channels, 4, 4))
        assert seen == [enabled or before] and torch.backends.cudnn.benchmark == before  # restored
        assert video.shape[0] == 1 and video.shape[-1] == 3


# --------------------------------------------------------------------------- building
def test_random_builds_are_deterministic(tiny_cfg: EncodersConfig, tiny: FrozenEncoders) -> None:
    rng_before = torch.random.get_rng_state()
    again = build_frozen_encoders(tiny_cfg)
    assert torch.equal(torch.random.get_rng_state(), rng_before), "building must not consume the caller's RNG"
    for name in ("t5", "clip", "vae"):
        assert_same_weights(getattr(tiny, name), getattr(again, name))
    torch.testing.assert_close(again.t5.encode(["softly talk"]), tiny.t5.encode(["softly talk"]), rtol=0, atol=0)
    video = random_video(SMALL_VIDEO)
    torch.testing.assert_close(again.vae.encode(video), tiny.vae.encode(video), rtol=0, atol=0)
    # One encoder alone is the same model as inside the full set.
    alone = build_frozen_encoders(tiny_cfg, which=("vae",))
    assert_same_weights(alone.vae, tiny.vae)
    other_seed = build_frozen_encoders(dataclasses.replace(tiny_cfg, seed=1), which=("clip",))
    other, base = other_seed.clip.state_dict(), tiny.clip.state_dict()
    assert not any(torch.equal(other[k], base[k]) for k in base if k.endswith("patch_embedding.weight"))


def test_build_selects_freezes_and_logs(tiny_cfg: EncodersConfig, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="animegamer.models.frozen_encoders"):
        enc = build_frozen_encoders(tiny_cfg, which=("t5", "clip"), dtype=torch.bfloat16)
    assert enc.vae is None and enc.t5 is not None and enc.clip is not None
    assert "random ['t5', 'clip']" in caplog.text
    for encoder in (enc.t5, enc.clip):
        assert not encoder.from_disk and encoder.dtype == torch.bfloat16
        assert not any(p.requires_grad for p in encoder.parameters())
    parent = torch.nn.ModuleDict({"t5": enc.t5})
    parent.train()  # what Lightning does to every submodule at the start of a fit
    assert not any(m.training for m in enc.t5.modules()), "dropout must stay off in a frozen encoder"
    assert enc.t5.encode(["a"]).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="unknown"):
        build_frozen_encoders(tiny_cfg, which=("t5", "llm"))


def test_tiny_encoders_are_small_enough_for_cpu(tiny: FrozenEncoders, clip_video: np.ndarray) -> None:
    """What makes the tiny preset fast on any CPU, counted rather than timed: the floating-point
    operations of one 17-frame 96x144 clip through each encoder and through the VAE decoder.

    A wall- or CPU-time bound depends on the machine and on what else runs on it; the operation count
    does not (the counts measured: benchmarks/README.md, 'Numbers behind comments')."""
    counts = {}
    for name, run in (
        ("t5", lambda: tiny.t5.encode(["softly talk"])),
        ("clip", lambda: tiny.clip.encode(clip_video[0])),  # all 17 frames, not only the first
        ("vae", lambda: tiny.vae.encode(clip_video)),
    ):
        with FlopCounterMode(display=False) as counter:
            run()
        counts[name] = counter.get_total_flops()
    latents = tiny.vae.encode(clip_video)
    with FlopCounterMode(display=False) as counter:
        tiny.vae.decode(latents)
    logger.info("tiny encoders, FLOPs per clip: %s; VAE decode %.3g", counts, counter.get_total_flops())
    assert all(count > 0 for count in counts.values()), counts  # every network's matmuls and convolutions seen
    assert sum(counts.values()) < TINY_ENCODE_FLOPS, counts
    assert 0 < counter.get_total_flops() < TINY_DECODE_FLOPS


# --------------------------------------------------------------------------- local folders
def _save_t5(enc: FrozenT5, model_dir: Path, tokenizer_dir: Path) -> None:
    enc.model.save_pretrained(model_dir)
    enc.tokenizer.save_pretrained(tokenizer_dir)


def test_local_folders_load_the_same_model(
    tmp_path: Path, tiny_cfg: EncodersConfig, tiny: FrozenEncoders, clip_video: np.ndarray
) -> None:
    """save_pretrained a random tiny model, load it through ``path``: identical outputs."""
    _save_t5(tiny.t5, tmp_path / "t5", tmp_path / "t5")
    tiny.clip.model.save_pretrained(tmp_path / "clip")
    tiny.vae.model.save_pretrained(tmp_path / "vae")
    cfg = dataclasses.replace(
        tiny_cfg,
        t5=with_path(tiny_cfg.t5, tmp_path / "t5"),
        clip=with_path(tiny_cfg.clip, tmp_path / "clip"),
        vae=with_path(tiny_cfg.vae, tmp_path / "vae"),
        seed=123,  # must not matter: nothing is random
    )
    loaded = build_frozen_encoders(cfg)
    assert loaded.t5.from_disk and loaded.clip.from_disk and loaded.vae.from_disk
    texts = ["softly talk", "jump"]
    torch.testing.assert_close(loaded.t5.encode(texts), tiny.t5.encode(texts), rtol=0, atol=0)
    frames = clip_video[0, :3]
    torch.testing.assert_close(loaded.clip.encode(frames), tiny.clip.encode(frames), rtol=0, atol=0)
    video = random_video(SMALL_VIDEO)
    torch.testing.assert_close(loaded.vae.encode(video), tiny.vae.encode(video), rtol=0, atol=0)


def test_diffusers_pipeline_layout(tmp_path: Path, tiny_cfg: EncodersConfig, tiny: FrozenEncoders) -> None:
    """One pipeline folder: text_encoder/ + tokenizer/ + vae/ (+ image_encoder/)."""
    pipe = tmp_path / "pipe"
    _save_t5(tiny.t5, pipe / "text_encoder", pipe / "tokenizer")
    tiny.vae.model.save_pretrained(pipe / "vae")
    tiny.clip.model.save_pretrained(pipe / "image_encoder")
    (pipe / "model_index.json").write_text(json.dumps({"_class_name": "CogVideoXPipeline"}))
    t5 = FrozenT5(with_path(tiny_cfg.t5, pipe))
    vae = FrozenVAE(with_path(tiny_cfg.vae, pipe))
    clip = FrozenClipVision(with_path(tiny_cfg.clip, pipe))
    assert t5.source.endswith("text_encoder") and vae.source.endswith("vae") and clip.source.endswith("image_encoder")
    torch.testing.assert_close(t5.encode(["walk"]), tiny.t5.encode(["walk"]), rtol=0, atol=0)
    assert_same_weights(vae.model, tiny.vae.model)
    assert_same_weights(clip.model, tiny.clip.model)


def test_clip_loads_from_a_full_clip_model_folder(tmp_path: Path, tiny_cfg: EncodersConfig) -> None:
    """HF CLIP checkpoints (the laion2b one included) are full CLIPModels; only the vision tower loads."""
    from transformers import CLIPConfig, CLIPModel

    c = tiny_cfg.clip
    vision = dict(
        hidden_size=c.hidden_size,
        intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_hidden_layers,
        num_attention_heads=c.num_attention_heads,
        image_size=c.image_size,
        patch_size=c.patch_size,
    )
    text = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, vocab_size=99,
                bos_token_id=0, eos_token_id=1, pad_token_id=1)
    torch.manual_seed(0)
    full = CLIPModel(CLIPConfig(text_config=text, vision_config=vision, projection_dim=16)).eval()
    full.save_pretrained(tmp_path / "clip-full")
    clip = FrozenClipVision(with_path(c, tmp_path / "clip-full"))
    assert_same_weights(clip.model, full.vision_model)


def test_vae_scaling_factor_comes_from_the_folder(tmp_path: Path, tiny_cfg: EncodersConfig) -> None:
    from diffusers import AutoencoderKLCogVideoX

    n = len(tiny_cfg.vae.block_out_channels)
    torch.manual_seed(0)
    model = AutoencoderKLCogVideoX(
        down_block_types=("CogVideoXDownBlock3D",) * n,
        up_block_types=("CogVideoXUpBlock3D",) * n,
        block_out_channels=tuple(tiny_cfg.vae.block_out_channels),
        layers_per_block=tiny_cfg.vae.layers_per_block,
        latent_channels=tiny_cfg.vae.latent_channels,
        norm_num_groups=tiny_cfg.vae.norm_num_groups,
        scaling_factor=0.7,  # CogVideoX-5b's value; the schema default is 2b's 1.15258426
    ).eval()
    model.save_pretrained(tmp_path / "vae")
    vae = FrozenVAE(with_path(tiny_cfg.vae, tmp_path / "vae"))
    assert tiny_cfg.vae.scaling_factor != 0.7 and vae.scaling_factor == 0.7
    video = random_video(SMALL_VIDEO)
    latents = vae.encode(video)  # (B, T', C, H', W')
    with torch.no_grad():
        x = torch.from_numpy(video).permute(0, 4, 1, 2, 3).float() / 127.5 - 1.0  # (B, 3, T, H, W)
        mode = model.encode(x).latent_dist.mode()  # (B, C, T', H', W')
        decoded = model.decode(mode).sample  # (B, 3, T, H, W)
    torch.testing.assert_close(latents, 0.7 * mode.permute(0, 2, 1, 3, 4))
    expected_video = ((decoded + 1) / 2).clamp(0, 1).permute(0, 2, 3, 4, 1)  # (B, T, H, W, 3)
    torch.testing.assert_close(vae.decode(latents), expected_video, rtol=1e-4, atol=1e-5)


def test_missing_weights_in_a_folder_fail(tmp_path: Path, tiny_cfg: EncodersConfig, tiny: FrozenEncoders) -> None:
    """A folder whose config asks for more layers than its weights hold must not half-load."""
    _save_t5(tiny.t5, tmp_path / "t5", tmp_path / "t5")
    config_file = tmp_path / "t5" / "config.json"
    config = json.loads(config_file.read_text())
    config["num_layers"] += 1
    config_file.write_text(json.dumps(config))
    with pytest.raises(RuntimeError, match="missing"):
        FrozenT5(with_path(tiny_cfg.t5, tmp_path / "t5"))


def test_missing_folder_is_an_error_unless_random_is_allowed(
    tmp_path: Path, tiny_cfg: EncodersConfig, tiny: FrozenEncoders
) -> None:
    cfg = dataclasses.replace(tiny_cfg, clip=with_path(tiny_cfg.clip, tmp_path / "absent"))
    with pytest.raises(FileNotFoundError, match="absent"):
        build_frozen_encoders(cfg, which=("clip",))
    fallback = build_frozen_encoders(cfg, which=("clip",), random_if_missing=True)
    assert not fallback.clip.from_disk
    assert_same_weights(fallback.clip, tiny.clip)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="config.json"):
        FrozenVAE(with_path(tiny_cfg.vae, tmp_path / "empty"))


# --------------------------------------------------------------------------- paper sizes
def test_paper_sizes_build_on_the_meta_device() -> None:
    """True paper sizes without allocating weights: exact parameter counts and geometry."""
    paper = load_encoders_config("paper")
    assert paper.t5.path and paper.clip.path and paper.vae.path  # paper.yaml points at checkpoints/
    with torch.device("meta"):
        t5 = FrozenT5(with_path(paper.t5, ""))
        clip = FrozenClipVision(with_path(paper.clip, ""))
        vae = FrozenVAE(with_path(paper.vae, ""))
    counts = {name: count_parameters(m.model) for name, m in (("t5", t5), ("clip", clip), ("vae", vae))}
    logger.info("paper encoder parameter counts: %s", counts)
    assert counts == {"t5": T5_XXL_ENCODER_PARAMS, "clip": CLIP_B16_VISION_PARAMS, "vae": COGVIDEOX_VAE_PARAMS}
    assert all(p.is_meta for m in (t5, clip, vae) for p in m.parameters())
    assert (t5.max_tokens, t5.hidden_size) == (30, 4096)
    assert (clip.num_patches, clip.hidden_size) == (196, 768)
    assert vae.latent_shape(17, 480, 720) == (5, 16, 60, 90)
    assert (vae.temporal_compression, vae.spatial_compression) == (4, 8)
    assert vae.scaling_factor == pytest.approx(1.15258426)
