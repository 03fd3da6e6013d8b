"""Config composition (every group and experiment composes) and the one-pass validation."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict

import pytest
from omegaconf import OmegaConf, open_dict

from data_pipeline.config_checks import validate_pipeline_run
from animegamer.config.compose import OverrideError, compose_config, config_dir
from animegamer.config.schema import COMMANDS, LoggerConfig, RunConfig
from animegamer.config.validate import ConfigError


def _typed(cfg) -> RunConfig:
    return OmegaConf.to_object(cfg)


@pytest.mark.parametrize("root, experiment", [
    (root, p.stem) for root, command in COMMANDS.items()
    for p in sorted((config_dir() / command.folder / "experiment").glob("*.yaml"))])
def test_every_experiment_composes_into_its_commands_schema(root, experiment):
    cfg = compose_config(root, [f"experiment={experiment}"])
    assert type(_typed(cfg)) is COMMANDS[root].schema


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
    with pytest.raises(OverrideError, match=r"pipeline\.clips\.frame=17: pipeline\.clips \(ClipsConfig\) has no key "
                                            r"'frame'; did you mean pipeline\.clips\.frames\?"):
        compose_config("pipeline", ["pipeline.clips.frame=17"])


def test_wrong_type_is_rejected_by_the_schema():
    with pytest.raises(OverrideError, match=r"pipeline\.clips\.frames=many: Value 'many' of type 'str' could not be "
                                            r"converted to Integer \(pipeline\.clips\.frames: int\)"):
        compose_config("pipeline", ["pipeline.clips.frames=many"])


def test_films_data_needs_inputs():
    problems = pipeline_problems(compose_config("pipeline", ["source=films", "pipeline.caption.backend=none"]))
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


def test_every_phase_has_its_builder():
    from animegamer.phases.builders import BUILDERS
    from animegamer.phases.specs import PHASES

    assert BUILDERS.keys() == PHASES.keys()


@pytest.mark.parametrize("phase, override, schema", [
    ("a_joint", "phase.pack_tokens=1024", "PhaseAConfig"),
    ("a_warmup", "phase.pad_to_multiple=8", "PhaseAConfig"),
    ("b", "phase.text_dropout=0.1", "PhaseBConfig"),
    ("c", "phase.text_dropout=0", "PhaseCConfig"),  # phase (c)'s is unconditional_rep_prob
    ("c", "phase.input=clips", "PhaseCConfig"),
])
def test_a_field_of_another_phase_is_rejected_naming_the_schema(phase, override, schema):
    key = override.split("=")[0].split(".")[1]
    with pytest.raises(OverrideError) as caught:
        compose_config("train", [f"phase={phase}", override])
    assert str(caught.value).startswith(f"{override}: phase ({schema}) has no key '{key}'"), str(caught.value)


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


# --------------------------------------------------------------------------- keys the schema does not know
@pytest.mark.parametrize("override, message", [
    ("+phase.max_step=10", "+phase.max_step=10: phase (PhaseAConfig) has no key 'max_step'; did you mean "
                           "phase.max_steps?"),
    ("++phase.max_step=10", "++phase.max_step=10: phase (PhaseAConfig) has no key 'max_step'; did you mean "
                            "phase.max_steps?"),
    ("+pipeline.clip.stride_seconds=0.5", "+pipeline.clip.stride_seconds=0.5: pipeline (PipelineConfig) has no key "
                                          "'clip'; did you mean pipeline.clips?"),
    ("+seeed=3", "+seeed=3: the config (RunConfig) has no key 'seeed'; did you mean seed?"),
])
def test_a_key_added_with_plus_is_refused_unless_the_schema_has_it(override, message):
    """Hydra adds any key given with +: the composed config is walked against the schema."""
    with pytest.raises(OverrideError) as caught:
        compose_config("train", ["experiment=quickstart_a", override])
    assert str(caught.value) == message


def test_an_unknown_key_without_plus_names_the_closest_key_not_hydras_plus_advice():
    with pytest.raises(OverrideError) as caught:
        compose_config("pipeline", ["pipeline.clip.stride_seconds=0.5"])
    assert str(caught.value) == ("pipeline.clip.stride_seconds=0.5: pipeline (PipelineConfig) has no key 'clip'; "
                                 "did you mean pipeline.clips?")
    # at the root, a config group is a key too; with nothing close, the node's keys are listed
    with pytest.raises(OverrideError, match=r"^trainr=ddp: the config \(RunConfig\) has no key 'trainr'; did you mean "
                                            r"trainer\?$"):
        compose_config("train", ["trainr=ddp"])
    with pytest.raises(OverrideError, match=r"^logger\.zzz=1: logger \(LoggerConfig\) has no key 'zzz'; its keys: "
                                            r"kind, project, offline$"):
        compose_config("train", ["logger.zzz=1"])


def test_an_unknown_option_of_a_group_names_the_closest_and_every_option():
    with pytest.raises(OverrideError) as caught:
        compose_config("train", ["phase=bb"])
    assert str(caught.value) == "phase=bb: the group phase has no option 'bb'; did you mean phase=b? options: " \
                                "a_base, a_joint, a_warmup, b, c"  # the schemas registered in the group are no option


@dataclass
class Holder:
    extra: Dict[str, Any] = field(default_factory=dict)  # free-form: any key is its own
    logger: LoggerConfig = field(default_factory=LoggerConfig)


def test_keys_of_a_free_form_dict_field_stay_accepted():
    from animegamer.config.compose import unknown_keys

    cfg = OmegaConf.structured(Holder)
    cfg.extra.anything = {"nested": 1}
    with open_dict(cfg):  # as Hydra adds a key given with +
        OmegaConf.update(cfg, "logger.kindd", "csv", force_add=True)
        OmegaConf.update(cfg, "surplus", 1, force_add=True)
    assert list(unknown_keys(cfg)) == [("logger.kindd", LoggerConfig), ("surplus", Holder)]


def test_sweep_jobs_are_split_as_hydras_basic_sweeper_does():
    from animegamer.config.compose import sweep_jobs

    assert sweep_jobs(["model=tiny", "phase.lr=1e-3,5e-4"]) == [["model=tiny", "phase.lr=0.001"],
                                                                  ["model=tiny", "phase.lr=0.0005"]]


@pytest.mark.parametrize("body, said", [
    ("data: {val_fracton: 0.72}", "experiment/mine.yaml: data.val_fracton: data (TrainDataConfig) has no key "
                                  "'val_fracton'; did you mean data.val_fraction?"),
    ("trainer: {devices: two}", "experiment/mine.yaml: trainer.devices: Value 'two' of type 'str' could not be "
                                "converted to Integer"),
])
def test_a_bad_key_or_value_in_a_users_experiment_file_is_one_line_naming_the_file(tmp_path, body, said):
    (tmp_path / "experiment").mkdir()
    (tmp_path / "experiment" / "mine.yaml").write_text(f"# @package _global_\n{body}\n")
    with pytest.raises(OverrideError) as refused:
        compose_config("train", ["experiment=mine"], search_path=[tmp_path])
    assert str(refused.value) == said


def test_an_experiment_file_that_is_not_yaml_is_a_user_error_naming_its_line(tmp_path):
    from animegamer.errors import is_user_error

    (tmp_path / "experiment").mkdir()
    (tmp_path / "experiment" / "mine.yaml").write_text("# @package _global_\nphase: {max_steps: 100 warmup_steps: 5}\n")
    with pytest.raises(Exception) as refused:
        compose_config("train", ["experiment=mine"], search_path=[tmp_path])
    assert is_user_error(refused.value)
    assert f'in "{tmp_path / "experiment" / "mine.yaml"}", line 2, column 36' in str(refused.value)


def test_a_list_given_as_a_word_is_refused_showing_it_in_brackets():
    with pytest.raises(OverrideError) as refused:
        compose_config("pipeline", ["pipeline.inputs=user/films"])
    assert str(refused.value).endswith("(pipeline.inputs: List[str]); a list is written in brackets: "
                                       "'pipeline.inputs=[user/films]'")
