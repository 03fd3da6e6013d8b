"""Config composition (every group and experiment composes) and the one-pass validation."""
from __future__ import annotations

import pytest
from omegaconf import OmegaConf
from hydra.errors import ConfigCompositionException
from omegaconf.errors import ValidationError

from animegamer.config.compose import compose_config, config_dir
from animegamer.config.schema import RunConfig
from animegamer.config.validate import ConfigError, validate_pipeline_run


def _typed(cfg) -> RunConfig:
    return OmegaConf.to_object(cfg)


@pytest.mark.parametrize("root", ["pipeline", "train"])
@pytest.mark.parametrize("experiment", sorted(p.stem for p in (config_dir() / "experiment").glob("*.yaml")))
def test_every_experiment_composes_into_the_typed_schema(experiment, root):
    cfg = compose_config(root, [f"experiment={experiment}"])
    assert isinstance(_typed(cfg), RunConfig)


def test_quickstart_pipeline_validates():
    validate_pipeline_run(compose_config("pipeline", ["experiment=quickstart"]))


@pytest.mark.parametrize("model", ["tiny", "paper"])
def test_model_presets_compose(model):
    cfg = compose_config("pipeline", [f"model={model}"])
    assert cfg.model.name == model


def test_paper_preset_has_paper_numbers():
    cfg = compose_config("pipeline", ["model=paper"])
    assert (cfg.pipeline.clips.frames, cfg.pipeline.clips.fps) == (17, 8)
    assert (cfg.pipeline.clips.height, cfg.pipeline.clips.width) == (480, 720)
    enc = cfg.model.encoders
    assert (enc.t5.d_model, enc.t5.max_tokens, enc.clip.hidden_size) == (4096, 30, 768)
    assert (enc.clip.image_size // enc.clip.patch_size) ** 2 == 196


def test_validation_lists_every_problem_at_once(tmp_path):
    cfg = compose_config("pipeline", [
        "pipeline.clips.width=100",  # not a multiple of 16
        "pipeline.motion.fixed_edges=[3.0,1.0,2.0,4.0]",  # not ascending
        "pipeline.shots.detector=histogram",
        "pipeline.part=3", "pipeline.num_parts=2",
        "pipeline.caption.backend=vlm",  # no model folder
        f"model.encoders.t5.path={tmp_path / 'missing'}",
    ])
    with pytest.raises(ConfigError) as caught:
        validate_pipeline_run(cfg)
    text = str(caught.value)
    for needle in ["pipeline.clips size 100x480", "fixed_edges", "pipeline.shots.detector='histogram'",
                   "pipeline.part=3", "pipeline.caption.model_path", "model.encoders.t5.path"]:
        assert needle in text, needle
    assert len(caught.value.problems) == 6


def test_typo_in_override_is_rejected_by_the_schema():
    with pytest.raises((ConfigCompositionException, ValidationError)):
        compose_config("pipeline", ["pipeline.clips.frame=17"])


def test_wrong_type_is_rejected_by_the_schema():
    with pytest.raises((ConfigCompositionException, ValidationError)):
        compose_config("pipeline", ["pipeline.clips.frames=many"])


def test_films_data_needs_inputs():
    cfg = compose_config("pipeline", ["data=films", "pipeline.caption.backend=none"])
    with pytest.raises(Exception):
        validate_pipeline_run(cfg)  # inputs is ??? (mandatory) in data/films.yaml
