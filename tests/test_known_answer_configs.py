"""The known-answer benchmark's experiments live beside the library (benchmarks/known_answer/configs/), not in
its configs: each composes under its command's root through the benchmark's search path, and no command of
the library lists them."""
from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from animegamer.config.compose import OverrideError, compose_config, config_dir
from benchmarks.known_answer.data import SIZES, held_out_fraction
from benchmarks.known_answer.experiments import EVALUATE, PIPELINE, TRAIN, experiments, search_path

# What each size's experiments set (benchmarks/known_answer/configs/): its preset and clip width.
PRESET = {"ci": ("tiny", 64), "gpu": ("small", 96)}
HELD_OUT = 0.2  # known_answer_held_out.yaml: every stage and evaluation holds out the same shots
STAGE_PHASE = {"base": "a_base", "a": "a_joint", "b": "b", "c": "c"}  # each training stage's phase


def _compose(root: str, experiment: str):
    cfg = compose_config(root, [search_path(root), f"experiment={experiment}"])
    OmegaConf.to_object(cfg)  # into the root's typed schema
    return cfg


def test_each_command_has_the_benchmarks_experiments_of_every_size():
    assert experiments(PIPELINE) == sorted(size.experiment for size in SIZES.values())
    assert experiments(TRAIN) == sorted(f"known_answer_{size}_{stage}" for size in SIZES for stage in STAGE_PHASE)
    assert experiments(EVALUATE) == sorted(f"known_answer_{size}_eval" for size in SIZES)


@pytest.mark.parametrize("size", sorted(SIZES))
def test_every_experiment_composes_under_its_root_through_the_search_path(size):
    preset, width = PRESET[size]
    data = _compose(PIPELINE, f"known_answer_{size}")
    assert (data.model.name, data.pipeline.clips.width, data.model.mllm.tokenizer) == (preset, width, "words")
    for stage, phase in STAGE_PHASE.items():
        cfg = _compose(TRAIN, f"known_answer_{size}_{stage}")
        assert (cfg.phase.name, cfg.model.name, cfg.pipeline.clips.width) == (phase, preset, width)
        assert cfg.data.val_fraction == HELD_OUT
    evaluation = _compose(EVALUATE, f"known_answer_{size}_eval")
    assert (evaluation.model.name, evaluation.pipeline.clips.width, evaluation.data.val_fraction) == (
        preset, width, HELD_OUT)
    assert evaluation.model.mllm.constrained_states is True
    assert held_out_fraction(SIZES[size]) == HELD_OUT


def test_the_library_configs_hold_none_of_the_benchmarks_experiments():
    """What ``animegamer <verb> --help`` lists comes from the library's configs: the benchmark is not among it."""
    assert sorted(p.name for p in config_dir().rglob("known_answer*")) == []
    with pytest.raises(OverrideError, match="no option .known_answer_ci_a."):
        compose_config(TRAIN, ["experiment=known_answer_ci_a"])  # without the benchmark's search path


def test_the_search_path_names_each_roots_folder_then_the_data_sets():
    assert search_path(TRAIN).count("file://") == 2 and "/configs/train'" in search_path(TRAIN)
    assert search_path(PIPELINE).count("file://") == 1
    with pytest.raises(ValueError, match="unknown root config 'play'"):
        search_path("play")
