"""The decoder base stage (phase ``a_base``): what it trains, what it refuses, and the diffusers folder it
exports, which ``model.decoder.path`` loads back exactly (and under which a new motion-scope embedder
changes nothing at init)."""
from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from phase_a_helpers import tiny_train_cfg, write_synthetic_features

from animegamer.phases.preflight import validate_train_run
from animegamer.config.validate import ConfigError
from animegamer.models.decoder import BASE_FOLDER, MotionScopeDecoder
from animegamer.phases.phase_a import PhaseA
from animegamer.phases.run import train

PLAIN = "model.decoder.motion_scope=false"
TOLERANCE = 1e-6  # float32, tiny preset: the same weights and the same inputs give the same output
TRAINED_STEPS = 3


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    from omegaconf import OmegaConf

    from animegamer.config.compose import compose_config

    enc = OmegaConf.to_object(compose_config("train", ["model=tiny"]).model.encoders)
    return write_synthetic_features(tmp_path_factory.mktemp("synthetic"), enc)


@pytest.fixture(scope="module")
def base_run(data_root, tmp_path_factory) -> dict:
    """A few steps of the base stage on the tiny preset, exported."""
    composed, cfg = tiny_train_cfg(data_root, tmp_path_factory.mktemp("base"), "phase=a_base", PLAIN,
                                   f"phase.max_steps={TRAINED_STEPS}")
    validate_train_run(composed)
    return train(cfg, composed)


def _inputs(decoder: MotionScopeDecoder, batch: int = 2) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(7)
    latents = torch.randn(batch, 2, decoder.cfg.in_channels, 8, 12, generator=g)
    rep = torch.randn(batch, decoder.rep_tokens, decoder.hidden, generator=g)
    return latents, torch.tensor([10, 900][:batch]), rep, torch.tensor([3.0, 40.0][:batch])


def _output(decoder: MotionScopeDecoder) -> torch.Tensor:
    with torch.no_grad():
        return decoder.eval()(*_inputs(decoder))


def test_the_base_stage_trains_every_parameter_without_lora(data_root, tmp_path):
    _, cfg = tiny_train_cfg(data_root, tmp_path, "phase=a_base", PLAIN)
    module = PhaseA(cfg)
    names = [n for n, _ in module.model.named_parameters()]
    assert module.trainable_parameter_names() == sorted(names)
    decoder = [n for n in names if n.startswith("decoder.")]
    # 2 tiny blocks of 24 tensors each, 14 outside them (embeddings, norms, projections); no LoRA, no embedder.
    assert len(decoder) == 2 * 24 + 14
    assert not any("lora_" in n or "ofs_embedding" in n for n in names)


def test_the_base_stage_refuses_a_motion_scope_decoder(data_root, tmp_path):
    composed, _ = tiny_train_cfg(data_root, tmp_path, "phase=a_base")
    with pytest.raises(ConfigError) as caught:
        validate_train_run(composed)
    assert len(caught.value.problems) == 1 and "model.decoder.motion_scope=false" in caught.value.problems[0]


def test_the_exported_base_loads_through_decoder_path_exactly(base_run):
    from diffusers import CogVideoXTransformer3DModel

    trained = base_run["module"].model.decoder.float()
    folder = Path(base_run["export"]) / BASE_FOLDER
    # Every tensor of the folder is one the model has, and the other way round (the identity text projection too).
    _, info = CogVideoXTransformer3DModel.from_pretrained(folder, local_files_only=True, output_loading_info=True)
    assert info == {"missing_keys": [], "unexpected_keys": [], "mismatched_keys": [], "error_msgs": []}

    loaded = MotionScopeDecoder(replace(trained.cfg, path=str(folder)), trained.hidden, trained.rep_tokens)
    assert isinstance(loaded.transformer.patch_embed.text_proj, torch.nn.Identity)
    expected = _output(trained)
    assert torch.allclose(_output(loaded), expected, atol=TOLERANCE, rtol=0)
    # Not vacuous: the training steps moved the output away from the random build's.
    with torch.random.fork_rng():
        torch.manual_seed(base_run["module"].cfg.seed)
        fresh = MotionScopeDecoder(replace(trained.cfg, path=""), trained.hidden, trained.rep_tokens)
    assert (_output(fresh) - expected).abs().max() > 1e3 * TOLERANCE


def test_a_motion_scope_embedder_over_the_base_starts_as_the_base(base_run):
    base = base_run["module"].model.decoder.float()
    folder = Path(base_run["export"]) / BASE_FOLDER
    scoped = MotionScopeDecoder(replace(base.cfg, path=str(folder), motion_scope=True), base.hidden, base.rep_tokens)
    assert scoped.motion_scope_parameters()  # the embedder is there, zero-initialised
    assert torch.allclose(_output(scoped), _output(base), atol=TOLERANCE, rtol=0)


def test_a_gathered_state_writes_the_same_folder_and_a_partial_one_is_refused(base_run, tmp_path):
    from safetensors.torch import load_file

    decoder = base_run["module"].model.decoder
    state = {name: tensor.clone() for name, tensor in decoder.state_dict().items()}
    written = decoder.save_base(tmp_path / "gathered", state)
    ours = load_file(str(Path(base_run["export"]) / BASE_FOLDER / "diffusion_pytorch_model.safetensors"))
    theirs = load_file(str(written / "diffusion_pytorch_model.safetensors"))
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    state.pop("transformer.proj_out.weight")
    with pytest.raises(ValueError, match="lacks 1 transformer tensors"):
        decoder.save_base(tmp_path / "partial", state)


def test_a_warmup_over_the_base_loads_it_and_trains_only_its_own_groups(data_root, base_run, tmp_path):
    folder = Path(base_run["export"]) / BASE_FOLDER
    composed, cfg = tiny_train_cfg(data_root, tmp_path, "phase=a_warmup", f"model.decoder.path={folder}")
    validate_train_run(composed)
    module = PhaseA(cfg)
    base = base_run["module"].model.decoder.transformer.state_dict()
    loaded = module.model.decoder.transformer.state_dict()
    assert all(torch.equal(base[k], loaded[k]) for k in base)
    assert all(n.startswith("encoder.") or ".ofs_embedding." in n for n in module.trainable_parameter_names())


def test_the_recipe_refuses_a_base_stage_over_a_loaded_decoder(tmp_path):
    from animegamer.recipe import train_base_stage

    with pytest.raises(ValueError, match="model.decoder.path is too"):
        train_base_stage(["model=tiny", f"output_dir={tmp_path}"], [f"model.decoder.path={tmp_path}"])
    assert not any(tmp_path.iterdir())  # refused before anything was trained


def test_a_folder_with_a_trained_embedder_loaded_without_the_motion_scope_says_so(base_run, tmp_path, caplog):
    from safetensors.torch import load_file, save_file

    base = base_run["module"].model.decoder.float()
    plain = Path(base_run["export"]) / BASE_FOLDER
    scoped = MotionScopeDecoder(replace(base.cfg, path=str(plain), motion_scope=True), base.hidden, base.rep_tokens)
    folder = tmp_path / "with_embedder"
    shutil.copytree(plain, folder)
    weights = next(folder.glob("*.safetensors"))
    embedder = {f"ofs_embedding.{k}": v.contiguous() for k, v in scoped.transformer.ofs_embedding.state_dict().items()}
    save_file({**load_file(weights), **embedder}, weights, metadata={"format": "pt"})
    unused = "leaves unused"
    with caplog.at_level("WARNING", logger="animegamer.models.decoder"):
        MotionScopeDecoder(replace(base.cfg, path=str(plain), motion_scope=False), base.hidden, base.rep_tokens)
        assert unused not in caplog.text  # a plain base: nothing to say
        MotionScopeDecoder(replace(base.cfg, path=str(folder), motion_scope=False), base.hidden, base.rep_tokens)
    assert unused in caplog.text and str(folder) in caplog.text
