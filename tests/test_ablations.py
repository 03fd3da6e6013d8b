"""Every phase (a) experiment composes and validates; each Table 3 ablation runs a step on tiny models."""
from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from animegamer.phases.preflight import validate_train_run
from animegamer.config.compose import compose_config, config_dir
from animegamer.config.validate import ConfigError
from animegamer.phases.run import train

ABLATIONS = sorted(p.stem for p in (config_dir() / "train" / "experiment").glob("ablation_a_*.yaml"))
EXPECTED = {"ablation_a_random_frame", "ablation_a_less_params", "ablation_a_addition",
            "ablation_a_cross_attention", "ablation_a_no_warmup", "ablation_a_no_motion_scope"}


def test_all_table3_ablations_exist():
    assert set(ABLATIONS) == EXPECTED


@pytest.mark.parametrize("experiment", ["paper_a_warmup", "paper_a_joint", *ABLATIONS])
def test_paper_experiments_compose_with_paper_numbers(experiment):
    cfg = compose_config("train", [f"experiment={experiment}"])
    assert cfg.model.name == "paper" and cfg.trainer.precision == "bf16-mixed"
    assert cfg.phase.lr == pytest.approx(2e-4)
    assert cfg.phase.max_steps == (10_000 if experiment == "paper_a_warmup" else 80_000)
    assert (cfg.model.decoder.lora_rank, cfg.model.decoder.lora_alpha) == (64, 1.0)
    assert (cfg.phase.text_dropout, cfg.phase.image_dropout) == (0.05, 0.05)
    with pytest.raises(ConfigError):  # no paper weights or shards here: reported, all at once
        validate_train_run(cfg)


@pytest.mark.parametrize("experiment", ABLATIONS)
def test_ablation_runs_one_step_on_tiny_models(experiment, toy_run, tmp_path):
    output, _ = toy_run
    composed = compose_config("train", [
        f"experiment={experiment}", "model=tiny", "trainer=cpu", "logger=none", f"data.root={output}",
        f"output_dir={tmp_path}", "phase.init_from=''", "phase.max_steps=1", "phase.val_clips=0",
        "phase.batch_size=2", "phase.val_every_n_steps=1", "data.val_fraction=0.2",
    ])
    validate_train_run(composed)
    cfg = OmegaConf.to_object(composed)
    result = train(cfg, composed)
    assert result["step"] == 1 and result["metrics"]["train/loss"] > 0
    assert "val/loss" in result["metrics"]
