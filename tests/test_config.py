"""Config composition (every group and experiment composes) and the one-pass validation."""
from __future__ import annotations

import pytest
from omegaconf import OmegaConf
from hydra.errors import ConfigCompositionException
from omegaconf.errors import ValidationError

from animegamer.checks import validate_pipeline_run
from animegamer.config.compose import compose_config, config_dir
from animegamer.config.schema import RunConfig
from animegamer.config.validate import ConfigError


def _typed(cfg) -> RunConfig:
    return OmegaConf.to_object(cfg)


@pytest.mark.parametrize("root", ["pipeline", "train"])
@pytest.mark.parametrize("experiment", sorted(p.stem for p in (config_dir() / "experiment").glob("*.yaml")))
def test_every_experiment_composes_into_the_typed_schema(experiment, root):
    cfg = compose_config(root, [f"experiment={experiment}"])
    assert isinstance(_typed(cfg), RunConfig)


def pipeline_problems(cfg) -> list[str]:
    """What the pipeline validation reports for ``cfg``: [] when it accepts the config."""
    try:
        validate_pipeline_run(cfg)
    except ConfigError as error:
        return error.problems
    return []


def test_quickstart_pipeline_validates():
    assert pipeline_problems(compose_config("pipeline", ["experiment=quickstart"])) == []
    # The pass does read this config: one bad setting on top of it is the one problem it reports.
    problems = pipeline_problems(compose_config("pipeline", ["experiment=quickstart", "pipeline.clips.width=100"]))
    assert len(problems) == 1 and problems[0].startswith("pipeline.clips size 100x96: width must be a multiple of 16")


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
    problems = pipeline_problems(compose_config("pipeline", ["data=films", "pipeline.caption.backend=none"]))
    assert len(problems) == 1 and problems[0].startswith("pipeline.inputs is empty"), problems


# --------------------------------------------------------------------------- a schema per phase
def test_every_phase_yaml_composes_into_its_specs_schema():
    from animegamer.phases.specs import PHASES

    names = sorted(p.stem for p in (config_dir() / "phase").glob("*.yaml"))
    assert names == sorted(PHASES)
    for name, spec in PHASES.items():
        cfg = compose_config("train", [f"phase={name}"])
        assert cfg.phase.name == name
        assert OmegaConf.get_type(cfg.phase) is spec.config
        assert type(_typed(cfg).phase) is spec.config


@pytest.mark.parametrize("phase, override, schema", [
    ("a_joint", "phase.pack_tokens=1024", "PhaseAConfig"),
    ("a_warmup", "phase.pad_to_multiple=8", "PhaseAConfig"),
    ("b", "phase.text_dropout=0.1", "PhaseBConfig"),
    ("c", "phase.text_dropout=0", "PhaseCConfig"),  # phase (c)'s is unconditional_rep_prob
    ("c", "phase.input=clips", "PhaseCConfig"),
])
def test_a_field_of_another_phase_is_rejected_naming_the_schema(phase, override, schema):
    key = override.split("=")[0].split(".")[1]
    with pytest.raises(ConfigCompositionException) as caught:
        compose_config("train", [f"phase={phase}", override])
    assert f"Key '{key}' not in '{schema}'" in str(caught.value.__cause__)


def test_each_phase_keeps_its_own_fields():
    b = compose_config("train", ["phase=b", "phase.pack_tokens=600", "phase.pad_to_multiple=8"])
    assert (b.phase.pack_tokens, b.phase.pad_to_multiple) == (600, 8)
    c = compose_config("train", ["phase=c", "phase.unconditional_rep_prob=0.25"])
    assert c.phase.unconditional_rep_prob == 0.25 and "image_dropout" not in c.phase
    a = compose_config("train", ["phase=a_warmup", "phase.input=clips", "phase.random_frame=true"])
    assert (a.phase.input, a.phase.random_frame, a.phase.text_dropout) == ("clips", True, 0.05)


@pytest.mark.parametrize("frames, ok", [(17, True), (49, True), (9, True), (13, False), (5, False), (15, False)])
def test_clip_frames_must_give_an_odd_number_of_latent_frames(frames, ok):
    """13 frames -> 4 latent frames, which the CogVideoX VAE decodes to 16 frames; 17 -> 5 -> 17."""
    from animegamer.config.validate import check_pipeline

    cfg = OmegaConf.to_object(compose_config("pipeline", ["model=tiny", f"pipeline.clips.frames={frames}"]))
    frame_problems = [p for p in check_pipeline(cfg.pipeline, cfg.model.encoders) if "pipeline.clips.frames" in p]
    assert (frame_problems == []) == ok, frame_problems


@pytest.mark.parametrize("command", [["train.py"], ["evaluate.py"], ["-m", "data_pipeline"]])
def test_help_says_how_to_call_and_lists_the_groups_without_dumping_every_key(command):
    import subprocess
    import sys

    from conftest import REPO

    out = subprocess.run([sys.executable, *command, "--help"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    first = out.stdout.splitlines()[0]
    assert first.startswith(("Train one phase", "Evaluate a trained game", "The clip-and-caption pipeline")), first
    assert "== Config groups" in out.stdout and "experiment:" in out.stdout and "--cfg job" in out.stdout
    assert len(out.stdout.splitlines()) < 40  # the groups, not the whole resolved config
