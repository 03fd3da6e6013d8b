"""Importer of the official decoder checkpoint against the golden case computed with the official code.

``shared/reference/official_decoder_golden`` holds the official SAT decoder network at tiny sizes
(random weights, float32), its inputs and its two outputs: with the encoder path (T5 + CLIP
features) and with a representation given directly (the decoder-adaptation path). The importer must
place every official key, fill every module parameter, and reproduce both outputs.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch

from animegamer.config.schema import ActionEncoderConfig, DecoderConfig
from animegamer.models.decoder import MotionScopeDecoder
from animegamer.models.encoder import ActionAwareEncoder
from animegamer.models.official_decoder import KNOWN_UNUSED, load_official_decoder, read_official_state_dict

logger = logging.getLogger(__name__)

GOLDEN = Path(__file__).resolve().parents[2] / "shared" / "reference" / "official_decoder_golden"
CHECKPOINT = GOLDEN / "mp_rank_00_model_states.pt"
RELATIVE_TOLERANCE = 1e-5  # max |ours - expected| / max |expected|

pytestmark = pytest.mark.skipif(not CHECKPOINT.is_file(), reason=f"golden case not present: {GOLDEN}")


@pytest.fixture(scope="module")
def case() -> dict:
    return json.loads((GOLDEN / "case.json").read_text())


@pytest.fixture(scope="module")
def arrays() -> dict[str, torch.Tensor]:
    names = ("x", "ctx", "ip", "ar_rep", "expected_encoder_path", "expected_adaptation_path")
    return {name: torch.from_numpy(np.load(GOLDEN / f"{name}.npy", allow_pickle=False)) for name in names}


def _configs(case: dict) -> tuple[ActionEncoderConfig, DecoderConfig, int]:
    """Encoder and decoder configs at the golden sizes, plus the representation token count."""
    net = case["network"]
    heads = net["num_attention_heads"]
    eps = case["layernorm_eps"]
    encoder = ActionEncoderConfig(text_dim=case["t5_dim"], image_dim=case["clip_dim"], text_tokens=case["t5_tokens"],
                                  image_tokens=case["clip_tokens"], width=net["hidden_size"],
                                  layernorm_eps=eps["encoder_mix_norms"])
    decoder = DecoderConfig(num_layers=net["num_layers"], num_attention_heads=heads,
                            attention_head_dim=net["hidden_size"] // heads, in_channels=net["in_channels"],
                            out_channels=net["out_channels"], patch_size=net["patch_size"],
                            time_embed_dim=net["time_embed_dim"], sample_frames=net["num_frames"],
                            sample_height=net["latent_height"], sample_width=net["latent_width"],
                            spatial_interpolation_scale=net["spatial_interpolation"], lora_rank=net["lora_r"],
                            lora_alpha=net["lora_alpha"])
    return encoder, decoder, net["text_length"]


def _build(case: dict, **decoder_changes) -> tuple[ActionAwareEncoder, MotionScopeDecoder]:
    encoder_cfg, decoder_cfg, tokens = _configs(case)
    for key, value in decoder_changes.items():
        setattr(decoder_cfg, key, value)
    torch.manual_seed(0)
    return ActionAwareEncoder(encoder_cfg), MotionScopeDecoder(decoder_cfg, encoder_cfg.width, rep_tokens=tokens)


def _relative_error(ours: torch.Tensor, expected: torch.Tensor) -> float:
    return ((ours - expected).abs().max() / expected.abs().max()).item()


def _outputs(case: dict, arrays: dict, encoder: ActionAwareEncoder,
             decoder: MotionScopeDecoder) -> tuple[torch.Tensor, torch.Tensor]:
    """(encoder path, adaptation path) outputs at the case's timestep and flow value."""
    timestep = torch.tensor([case["timestep"]])
    flow = torch.tensor([case["flow_value"]], dtype=torch.float32)
    with torch.no_grad():
        rep = encoder(arrays["ctx"], arrays["ip"])
        encoder_path = decoder(arrays["x"], timestep, rep, flow)
        adaptation_path = decoder(arrays["x"], timestep, arrays["ar_rep"], flow)
    return encoder_path, adaptation_path


@pytest.mark.parametrize("merge_lora", [False, True], ids=["lora", "merged"])
def test_official_decoder_reproduces_golden_outputs(case, arrays, merge_lora):
    encoder, decoder = _build(case)
    report = load_official_decoder(CHECKPOINT, encoder, decoder, merge_lora=merge_lora)
    assert report.unplaced_keys == [] and report.unset_parameters == [], report.summary()
    assert report.ok
    assert sorted(report.known_unused) == sorted(KNOWN_UNUSED)
    assert decoder.has_lora is not merge_lora

    encoder_path, adaptation_path = _outputs(case, arrays, encoder, decoder)
    errors = (_relative_error(encoder_path, arrays["expected_encoder_path"]),
              _relative_error(adaptation_path, arrays["expected_adaptation_path"]))
    logger.info("golden decoder (merge_lora=%s): max relative error encoder path %.3g, adaptation path %.3g",
                merge_lora, *errors)
    assert max(errors) <= RELATIVE_TOLERANCE, errors


def test_official_position_table_matches_diffusers(case):
    encoder, decoder = _build(case)
    report = load_official_decoder(CHECKPOINT, encoder, decoder)
    note = next(n for n in report.notes if n.startswith("mixins.pos_embed.pos_embedding"))
    assert float(note.rsplit("=", 1)[1]) < 1e-6, note


def test_import_rescales_lora_to_another_alpha(case, arrays):
    """A decoder configured with another LoRA alpha still computes the official network."""
    encoder, decoder = _build(case, lora_alpha=4.0)
    report = load_official_decoder(CHECKPOINT, encoder, decoder)
    assert report.ok and any("rescaled" in n for n in report.notes)
    encoder_path, _ = _outputs(case, arrays, encoder, decoder)
    assert _relative_error(encoder_path, arrays["expected_encoder_path"]) <= RELATIVE_TOLERANCE


def test_merge_into_a_decoder_with_a_fresh_adapter(case, arrays):
    """Phase-a2 start from official weights: official LoRA merged, the new adapter adds nothing."""
    encoder, decoder = _build(case)
    decoder.add_lora()
    report = load_official_decoder(CHECKPOINT, encoder, decoder, merge_lora=True)
    assert report.ok
    _, adaptation_path = _outputs(case, arrays, encoder, decoder)
    assert _relative_error(adaptation_path, arrays["expected_adaptation_path"]) <= RELATIVE_TOLERANCE


def test_report_lists_what_could_not_be_placed(case):
    """Without an encoder or motion scope, their official keys are reported, not dropped silently."""
    _, decoder = _build(case, motion_scope=False)
    report = load_official_decoder(CHECKPOINT, None, decoder)
    assert not report.ok
    assert any(k.startswith("flow_embed.") for k in report.unplaced_keys)
    assert any(k.startswith("mixins.patch_embed.text_proj") for k in report.unplaced_keys)
    assert report.unset_parameters == []


def test_import_refuses_other_sizes(case):
    _, decoder_cfg, tokens = _configs(case)
    wide = ActionEncoderConfig(text_dim=case["t5_dim"], image_dim=case["clip_dim"], width=decoder_cfg.time_embed_dim)
    decoder_cfg.num_attention_heads, decoder_cfg.attention_head_dim = 1, decoder_cfg.time_embed_dim
    decoder = MotionScopeDecoder(decoder_cfg, wide.width, rep_tokens=tokens)
    with pytest.raises(ValueError, match="do not fit"):
        load_official_decoder(CHECKPOINT, ActionAwareEncoder(wide), decoder)


def test_state_dict_reader_strips_the_prefix():
    state = read_official_state_dict(GOLDEN)  # a folder works too
    assert "flow_embed.0.weight" in state and not any(k.startswith("model.") for k in state)


@pytest.mark.parametrize("stage", ["a_warmup", "a_joint"])
def test_phase_a_starts_from_the_official_decoder_by_config(case, arrays, stage):
    """``model.decoder.official_checkpoint`` makes phase (a) start from the official network."""
    from dataclasses import replace

    from animegamer.config.schema import ModelConfig, PhaseConfig, RunConfig
    from animegamer.phases.phase_a import PhaseA

    encoder_cfg, decoder_cfg, _ = _configs(case)
    decoder_cfg = replace(decoder_cfg, official_checkpoint=str(CHECKPOINT))
    cfg = RunConfig(model=ModelConfig(name="golden", encoder=encoder_cfg, decoder=decoder_cfg),
                    phase=PhaseConfig(name=stage))
    model = PhaseA(cfg).model
    assert model.decoder.has_lora is (stage == "a_joint")
    encoder_path, adaptation_path = _outputs(case, arrays, model.encoder, model.decoder)
    assert _relative_error(encoder_path, arrays["expected_encoder_path"]) <= RELATIVE_TOLERANCE
    assert _relative_error(adaptation_path, arrays["expected_adaptation_path"]) <= RELATIVE_TOLERANCE
