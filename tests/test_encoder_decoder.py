"""Action-aware encoder and MotionScope decoder at the tiny preset: CPU, a few seconds in all.

Paper sizes are checked on the meta device (no weights allocated) for the exact sizes of the
groups that train: the motion-scope embedder and the LoRA matrices.
"""
from __future__ import annotations

import dataclasses
import logging

import pytest
import torch
from omegaconf import OmegaConf

from animegamer.config.compose import compose_config
from animegamer.config.schema import ActionEncoderConfig, DecoderConfig, ModelConfig
from animegamer.models.decoder import MotionScopeDecoder
from animegamer.models.encoder import FUSIONS, ActionAwareEncoder

logger = logging.getLogger(__name__)

BATCH = 2
LATENT_FRAMES = 2  # enough for every shape check, cheap for the tiny transformer
SEED = 0
PAPER_HIDDEN = 1920
PAPER_TIME_WIDTH = 512
PAPER_LORA_RANK = 64
PAPER_LAYERS = 30
LORA_TARGET_COUNT = 4  # to_q, to_k, to_v, to_out.0


@pytest.fixture(scope="module")
def model_cfg() -> ModelConfig:
    return OmegaConf.to_object(compose_config("pipeline", ["model=tiny"]).model)


def _features(cfg: ActionEncoderConfig, batch: int = BATCH) -> tuple[torch.Tensor, torch.Tensor]:
    """Random T5-like and CLIP-like features at the configured widths and token counts."""
    generator = torch.Generator().manual_seed(SEED)
    text = torch.randn(batch, cfg.text_tokens, cfg.text_dim, generator=generator)
    image = torch.randn(batch, cfg.image_tokens, cfg.image_dim, generator=generator)
    return text, image


def _decoder_inputs(cfg: DecoderConfig, rep_tokens: int, width: int) -> dict:
    """One batch of decoder inputs: latents (B, T, C, H, W), timesteps, rep (B, N, D), flow values."""
    generator = torch.Generator().manual_seed(SEED + 1)
    return dict(
        latents=torch.randn(BATCH, LATENT_FRAMES, cfg.in_channels, cfg.sample_height, cfg.sample_width,
                            generator=generator),
        timestep=torch.tensor([17, 803]),
        rep=torch.randn(BATCH, rep_tokens, width, generator=generator),
        flow=torch.tensor([1.5, 12.0]),
    )


def _decoder(model_cfg: ModelConfig, **changes) -> MotionScopeDecoder:
    torch.manual_seed(SEED)
    cfg = dataclasses.replace(model_cfg.decoder, **changes)
    return MotionScopeDecoder(cfg, model_cfg.encoder.width, rep_tokens=_rep_tokens(model_cfg))


def randomize_lora_b(decoder: MotionScopeDecoder) -> None:
    """LoRA B is zero at init: give the adapters an effect that comparisons can see."""
    with torch.no_grad():
        for name, param in decoder.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.05, generator=torch.Generator().manual_seed(SEED))


def _rep_tokens(model_cfg: ModelConfig) -> int:
    return model_cfg.encoder.text_tokens + model_cfg.encoder.image_tokens


# --------------------------------------------------------------------------- encoder
@pytest.mark.parametrize("fusion", FUSIONS)
@pytest.mark.parametrize("mlp", [True, False])
def test_encoder_shapes(model_cfg, fusion, mlp):
    cfg = dataclasses.replace(model_cfg.encoder, fusion=fusion, mlp=mlp)
    encoder = ActionAwareEncoder(cfg)
    rep = encoder(*_features(cfg))
    expected_tokens = cfg.image_tokens if fusion == "add" else cfg.text_tokens + cfg.image_tokens
    assert encoder.num_tokens == expected_tokens
    assert rep.shape == (BATCH, expected_tokens, cfg.width)
    assert torch.isfinite(rep).all()


def test_encoder_concat_puts_text_first(model_cfg):
    """The official layout: the first Lt tokens are the normalised text branch alone."""
    encoder = ActionAwareEncoder(model_cfg.encoder)
    text, image = _features(model_cfg.encoder)
    rep = encoder(text, image)
    assert torch.equal(rep[:, : model_cfg.encoder.text_tokens], encoder.encode_text(text))
    assert torch.equal(rep[:, model_cfg.encoder.text_tokens:], encoder.encode_image(image))


def test_encoder_add_fusion_is_image_plus_text_mean(model_cfg):
    cfg = dataclasses.replace(model_cfg.encoder, fusion="add")
    encoder = ActionAwareEncoder(cfg)
    text, image = _features(cfg)
    expected = encoder.encode_image(image) + encoder.encode_text(text).mean(dim=1, keepdim=True)
    torch.testing.assert_close(encoder(text, image), expected, rtol=0, atol=0)


def test_encoder_less_params_ablation_is_smaller(model_cfg):
    mlp = ActionAwareEncoder(model_cfg.encoder)
    linear = ActionAwareEncoder(dataclasses.replace(model_cfg.encoder, mlp=False))
    assert isinstance(linear.text_proj, torch.nn.Linear) and isinstance(linear.image_proj, torch.nn.Linear)
    assert sum(p.numel() for p in linear.parameters()) < sum(p.numel() for p in mlp.parameters())


def test_encoder_rejects_bad_inputs(model_cfg):
    with pytest.raises(ValueError, match="fusion"):
        ActionAwareEncoder(dataclasses.replace(model_cfg.encoder, fusion="multiply"))
    encoder = ActionAwareEncoder(model_cfg.encoder)
    text, image = _features(model_cfg.encoder)
    with pytest.raises(ValueError, match="text features"):
        encoder(text[..., :-1], image)
    with pytest.raises(ValueError, match="batch sizes"):
        encoder(text, image[:1])


# --------------------------------------------------------------------------- decoder
def test_decoder_output_shape_and_zero_motion_scope_at_init(model_cfg):
    decoder = _decoder(model_cfg)
    inputs = _decoder_inputs(model_cfg.decoder, decoder.rep_tokens, decoder.hidden)
    transformer = decoder.transformer
    with torch.no_grad():
        flow_embedding = transformer.ofs_embedding(transformer.ofs_proj(inputs["flow"]))
        out = decoder(**inputs)
        other_flow = decoder(**{**inputs, "flow": torch.tensor([4.0, 40.0])})
    assert flow_embedding.shape == (BATCH, model_cfg.decoder.time_embed_dim)
    assert torch.count_nonzero(flow_embedding) == 0
    assert out.shape == inputs["latents"].shape
    assert torch.equal(out, other_flow), "a zero-initialised embedder must make the output flow-independent"


def test_decoder_flow_reaches_the_output_once_trained(model_cfg):
    """Guards the wiring: with a non-zero last layer the flow value must change the prediction."""
    decoder = _decoder(model_cfg)
    inputs = _decoder_inputs(model_cfg.decoder, decoder.rep_tokens, decoder.hidden)
    with torch.no_grad():
        torch.nn.init.normal_(decoder.transformer.ofs_embedding.linear_2.weight)
        out = decoder(**inputs)
        other_flow = decoder(**{**inputs, "flow": torch.tensor([4.0, 40.0])})
    assert not torch.allclose(out, other_flow)


def test_decoder_without_motion_scope(model_cfg):
    decoder = _decoder(model_cfg, motion_scope=False)
    inputs = _decoder_inputs(model_cfg.decoder, decoder.rep_tokens, decoder.hidden)
    assert decoder.motion_scope_parameters() == []
    assert decoder.transformer.ofs_embedding is None
    with torch.no_grad():
        out = decoder(**inputs)
        no_flow = decoder(**{**inputs, "flow": None})
    assert torch.equal(out, no_flow)


def test_decoder_lora_leaves_output_and_trainability_unchanged(model_cfg):
    decoder = _decoder(model_cfg)
    inputs = _decoder_inputs(model_cfg.decoder, decoder.rep_tokens, decoder.hidden)
    for name in decoder.adaln_parameters():
        dict(decoder.named_parameters())[name].requires_grad_(False)
    decoder.transformer.transformer_blocks[0].attn1.to_q.weight.requires_grad_(False)  # becomes base_layer
    flags = {n: p.requires_grad for n, p in decoder.named_parameters()}
    with torch.no_grad():
        before = decoder(**inputs)
        decoder.add_lora()
        after = decoder(**inputs)
    assert torch.equal(before, after), "lora_B starts at zero, so adding LoRA must not change the output"
    params = dict(decoder.named_parameters())
    renamed = {n.replace(".base_layer.", "."): n for n in params}
    assert all(params[renamed[n]].requires_grad == flag for n, flag in flags.items())
    assert all(params[n].requires_grad for n in decoder.lora_parameters())
    layer = decoder.transformer.transformer_blocks[0].attn1.to_q
    assert layer.scaling["default"] == model_cfg.decoder.lora_alpha / model_cfg.decoder.lora_rank
    with pytest.raises(RuntimeError, match="already"):
        decoder.add_lora()


def _expected_groups(model_cfg: ModelConfig) -> dict[str, set[str]]:
    """The trainable groups written out from the configuration, independently of the helpers."""
    blocks = range(model_cfg.decoder.num_layers)
    motion = {f"transformer.ofs_embedding.linear_{i}.{p}" for i in (1, 2) for p in ("weight", "bias")}
    adaln = {f"transformer.transformer_blocks.{b}.norm{i}.linear.{p}"
             for b in blocks for i in (1, 2) for p in ("weight", "bias")}
    lora = {f"transformer.transformer_blocks.{b}.attn1.{t}.lora_{m}.default.weight"
            for b in blocks for t in model_cfg.decoder.lora_targets for m in ("A", "B")}
    return {"motion": motion, "adaln": adaln, "lora": lora}


def test_decoder_parameter_groups(model_cfg):
    decoder = _decoder(model_cfg)
    assert decoder.lora_parameters() == []
    decoder.add_lora()
    groups = {"motion": decoder.motion_scope_parameters(), "adaln": decoder.adaln_parameters(),
              "lora": decoder.lora_parameters()}
    expected = _expected_groups(model_cfg)
    for key, names in groups.items():
        assert names and len(names) == len(set(names))
        assert set(names) == expected[key], key
    union = [n for names in groups.values() for n in names]
    assert len(union) == len(set(union)), "groups must be disjoint"
    final = set(decoder.adaln_parameters(include_final=True)) - set(groups["adaln"])
    assert final == {"transformer.norm_out.linear.weight", "transformer.norm_out.linear.bias"}


def test_save_and_load_lora_round_trip(model_cfg, tmp_path):
    decoder = _decoder(model_cfg)
    decoder.add_lora()
    with torch.no_grad():
        for name in decoder.lora_parameters():
            torch.nn.init.normal_(dict(decoder.named_parameters())[name])
    folder = decoder.save_adapter(tmp_path / "lora")
    assert (folder / "adapter_model.safetensors").is_file() and (folder / "adapter_config.json").is_file()

    fresh = _decoder(model_cfg)  # no adapter yet: load_adapter adds it with the folder's rank and alpha
    fresh.load_adapter(folder)
    saved, loaded = dict(decoder.named_parameters()), dict(fresh.named_parameters())
    assert fresh.lora_parameters() == decoder.lora_parameters()
    for name in decoder.lora_parameters():
        assert torch.equal(saved[name], loaded[name]), name

    fresh.load_state_dict(decoder.state_dict())
    inputs = _decoder_inputs(model_cfg.decoder, decoder.rep_tokens, decoder.hidden)
    with torch.no_grad():
        assert torch.equal(decoder(**inputs), fresh(**inputs))

    other_rank = _decoder(model_cfg, lora_rank=model_cfg.decoder.lora_rank * 2)
    other_rank.add_lora()
    with pytest.raises(ValueError, match="rank"):
        other_rank.load_adapter(folder)


def test_gradient_checkpointing_trains_the_same(model_cfg):
    """Checkpointing changes memory, never the gradients."""
    grads = []
    for enabled in (False, True):
        decoder = _decoder(model_cfg, gradient_checkpointing=enabled)
        assert decoder.transformer.gradient_checkpointing is enabled
        inputs = _decoder_inputs(model_cfg.decoder, decoder.rep_tokens, decoder.hidden)
        decoder(**inputs).square().mean().backward()
        grads.append(decoder.transformer.transformer_blocks[0].norm1.linear.weight.grad.clone())
    torch.testing.assert_close(grads[0], grads[1])


def test_decoder_rejects_mismatched_representation(model_cfg):
    with pytest.raises(ValueError, match="hidden size"):
        MotionScopeDecoder(model_cfg.decoder, model_cfg.encoder.width + 1, rep_tokens=_rep_tokens(model_cfg))
    decoder = _decoder(model_cfg)
    inputs = _decoder_inputs(model_cfg.decoder, decoder.rep_tokens + 1, decoder.hidden)
    with pytest.raises(ValueError, match="rep must be"):
        decoder(**inputs)
    with pytest.raises(ValueError, match="flow"):
        decoder(**{**_decoder_inputs(model_cfg.decoder, decoder.rep_tokens, decoder.hidden), "flow": None})


def test_decoder_loads_a_local_folder_with_its_motion_scope(model_cfg, tmp_path):
    """A pipeline-layout folder (``transformer/``) loads without the hub, motion scope included."""
    decoder = _decoder(model_cfg)
    with torch.no_grad():
        torch.nn.init.normal_(decoder.transformer.ofs_embedding.linear_2.weight)
    decoder.transformer.save_pretrained(tmp_path / "pipeline" / "transformer")
    loaded = _decoder(model_cfg, path=str(tmp_path / "pipeline"))
    inputs = _decoder_inputs(model_cfg.decoder, decoder.rep_tokens, decoder.hidden)
    with torch.no_grad():
        assert torch.equal(decoder(**inputs), loaded(**inputs))
    with pytest.raises(ValueError, match="num_layers"):
        _decoder(model_cfg, path=str(tmp_path / "pipeline"), num_layers=model_cfg.decoder.num_layers + 1)
    with pytest.raises(FileNotFoundError):
        _decoder(model_cfg, path=str(tmp_path / "missing"))


def test_paper_sizes_on_meta_device():
    """Paper-scale group sizes without allocating weights: embedder Linear(1920,512)-Linear(512,512),
    LoRA r 64 on four 1920x1920 projections in each of 30 blocks."""
    with torch.device("meta"):
        decoder = MotionScopeDecoder(DecoderConfig(), PAPER_HIDDEN)
        decoder.add_lora()
    params = dict(decoder.named_parameters())
    motion = sum(params[n].numel() for n in decoder.motion_scope_parameters())
    lora = sum(params[n].numel() for n in decoder.lora_parameters())
    expected_motion = PAPER_HIDDEN * PAPER_TIME_WIDTH + PAPER_TIME_WIDTH + PAPER_TIME_WIDTH ** 2 + PAPER_TIME_WIDTH
    expected_lora = PAPER_LAYERS * LORA_TARGET_COUNT * 2 * PAPER_LORA_RANK * PAPER_HIDDEN
    assert (motion, lora) == (expected_motion, expected_lora)
    assert len(decoder.adaln_parameters()) == PAPER_LAYERS * 4
    logger.info("paper decoder: %d parameters (text_proj bypassed)", sum(p.numel() for p in params.values()))


def test_decoder_compile_mode_reaches_torch_compile(model_cfg, monkeypatch):
    seen = []
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, **kwargs: seen.append(kwargs))
    _decoder(model_cfg, compile=True, compile_mode="max-autotune")
    assert seen == [{"dynamic": False, "mode": "max-autotune"}]


@pytest.mark.parametrize("checkpointing", [False, True])
def test_compiled_decoder_trains_like_eager(model_cfg, checkpointing):
    """``model.decoder.compile``: the compiled transformer (training and sampling share it) gives the
    eager output and gradients, with LoRA and the motion-scope embedder in the graph."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    results = []
    for compiled in (False, True):
        # one block: the blocks share their code, and each adds its forward and backward to the compile
        decoder = _decoder(model_cfg, num_layers=1, gradient_checkpointing=checkpointing, compile=compiled)
        decoder.add_lora()
        randomize_lora_b(decoder)
        inputs = _decoder_inputs(model_cfg.decoder, decoder.rep_tokens, decoder.hidden)
        out = decoder(**inputs)
        out.square().mean().backward()
        grads = {n: p.grad.clone() for n, p in decoder.named_parameters() if p.grad is not None}
        results.append((out.detach(), grads, [n for n, _ in decoder.named_parameters()]))
    (out_e, grads_e, names_e), (out_c, grads_c, names_c) = results
    # the compiled run went through Dynamo as one graph (the eager run adds none)
    assert counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"]
    assert names_c == names_e  # compiled in place: checkpoints and exports keep their keys
    torch.testing.assert_close(out_c, out_e, rtol=1e-4, atol=1e-5)
    assert grads_c.keys() == grads_e.keys() and any("lora_B" in n for n in grads_e)
    for name in grads_e:
        torch.testing.assert_close(grads_c[name], grads_e[name], rtol=1e-3, atol=1e-5, msg=name)
