"""``python -m benchmarks.known_answer OUT --vae-from FOLDER``: the benchmark loads a VAE trained elsewhere
instead of training its own, once the folder is checked (before any film is drawn: a trained folder of the
size's preset VAE config; once the clips are cut: trained on them)."""
from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from animegamer.config.compose import compose_config
from animegamer.config.schema import VAEConfig
from animegamer.data.trained_data import clip_content_sha256
from animegamer.errors import InvalidInputError
from animegamer.toy_vae import TRAINING_RECORD, save_vae
from benchmarks.known_answer.driver import SIZES, VAE_DIR, Layout, main, recipe_of, run_benchmark
from test_known_answer import one_torch_thread

SIZE = "ci"
FILMS = 1  # half the size's: the clips are cut and nothing trains
# What a staged folder's record says beyond what the checks read: the result's VAE block carries it.
HELD_OUT_PSNR, TOTAL_STEPS = 27.5, 12
FIRST_STAGE = {"weights_sha256": "a" * 64, "held_out_psnr": 24.0, "total_steps": 7, "init": None}
OTHER_CLIPS = "0" * 64


def preset_vae(out: Path) -> VAEConfig:
    """The VAE config of the size's stages: their preset's, as phase (a2) of the driver's recipe composes it."""
    from omegaconf import OmegaConf

    from animegamer.recipe import stage_overrides

    recipe = recipe_of(Layout(out, 0), SIZES[SIZE])
    cfg = compose_config("train", [*recipe.phase_a, "phase=a_joint", *stage_overrides("train", recipe.extra)])
    return OmegaConf.to_object(cfg.model.encoders.vae)


def vae_folder(folder: Path, vae_cfg: VAEConfig, clips_sha256: str) -> Path:
    """A VAE folder as ``python -m animegamer.toy_vae`` leaves a second stage: the weights of ``vae_cfg`` and a
    record naming its config, the clips it was trained on, its held-out PSNR and its chain."""
    from animegamer.models.vae_training import trainable_vae

    return save_vae(trainable_vae(vae_cfg, 0), folder, {
        "scaling_factor": 1.0, "held_out_psnr": HELD_OUT_PSNR, "steps_done": 5, "total_steps": TOTAL_STEPS,
        "init": FIRST_STAGE, "vae": asdict(vae_cfg), "clip_content_sha256": clips_sha256})


@pytest.fixture
def root_logging():
    """The root logger's handlers as they were: the command sets up its own, writing to this test's
    captured stderr, which is closed once the test ends."""
    import logging

    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.mark.parametrize("case", ["other config", "not trained", "with training options"])
def test_a_folder_the_benchmark_cannot_use_is_refused_by_name_before_anything_is_written(
        tmp_path: Path, capsys, root_logging, case: str) -> None:
    out = tmp_path / "out"
    folder = tmp_path / "vae_s2"
    options = ["--vae-from", str(folder)]
    vae_cfg = preset_vae(out)
    if case == "other config":
        vae_folder(folder, replace(vae_cfg, latent_channels=vae_cfg.latent_channels * 2), OTHER_CLIPS)
        words = (f"--vae-from {folder}: trained with another VAE config (latent_channels: "
                 f"{vae_cfg.latent_channels * 2}, here {vae_cfg.latent_channels})")
    elif case == "not trained":
        folder.mkdir()
        words = f"--vae-from {folder}: not a trained VAE folder (no training.json or"
    else:
        vae_folder(folder, vae_cfg, OTHER_CLIPS)
        options += ["--vae-steps", "3"]
        words = (f"--vae-from {folder} uses a trained VAE as it is: the VAE training options (--vae-max-seconds/"
                 "--vae-steps/--vae-device) do not apply to it")
    with pytest.raises(SystemExit) as exit_info:
        main([str(out), "--size", SIZE, *options])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"error: {words}" in err and "Traceback" not in err
    assert not out.exists()  # no film drawn, nothing written


@pytest.fixture(scope="module")
def cut(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    """The benchmark's films and clips in OUT, cut by a run handed a VAE folder of the right config trained on
    other clips; returns OUT, that folder and the run's refusal."""
    out = tmp_path_factory.mktemp("known_answer")
    folder = vae_folder(out.parent / f"{out.name}_other_clips", preset_vae(out), OTHER_CLIPS)
    with one_torch_thread(), pytest.raises(InvalidInputError) as refused:
        run_benchmark(out, SIZE, ablations=(), a2_renderer=False, films=FILMS, vae_from=folder)
    return out, folder, str(refused.value)


class FeaturesStarted(Exception):
    """Raised in place of the first pipeline call after the clip steps: its overrides are what it was given."""


def test_a_folder_trained_on_other_clips_is_refused_once_they_are_cut_before_any_feature(cut) -> None:
    out, folder, refusal = cut
    clips = clip_content_sha256(out / "pipeline", "clips")
    assert clips is not None and clips != OTHER_CLIPS
    assert f"{folder}: trained on other clips (clip content sha256 {OTHER_CLIPS}) than this run's ({clips}, " \
           in refusal
    assert not (out / VAE_DIR).exists() and not (out / "pipeline" / "features").exists()
    assert not (out / "seed_0").exists()  # nothing trained


def test_a_good_folder_is_the_vae_of_every_stage_and_of_the_result(cut, tmp_path: Path, monkeypatch) -> None:
    """Handed a folder trained on the benchmark's clips, the recipe's stages (from precompute on) and the
    driver's own (ablations, other renderers) load it, ``OUT/vae`` is never made, and the result's VAE
    block is the folder's record."""
    import animegamer.recipe as recipe
    import benchmarks.known_answer.driver as driver
    from benchmarks.known_answer.data import TRUTH_WORDS_KEY

    out, _, _ = cut
    folder = vae_folder(tmp_path / "vae_s2", preset_vae(out), clip_content_sha256(out / "pipeline", "clips"))
    pipeline_step = recipe.run_pipeline_step

    def clip_steps_only(overrides: list[str]) -> dict:
        if any(o.startswith("pipeline.steps=") and "precompute" in o for o in overrides):
            raise FeaturesStarted(overrides)
        return pipeline_step(overrides)

    monkeypatch.setattr(recipe, "run_pipeline_step", clip_steps_only)
    with one_torch_thread(), pytest.raises(FeaturesStarted) as features:
        run_benchmark(out, SIZE, ablations=(), a2_renderer=False, films=FILMS, vae_from=folder)
    loaded = str(folder.resolve())
    assert compose_config("pipeline", features.value.args[0]).model.encoders.vae.path == loaded
    assert not (out / VAE_DIR).exists()  # nothing trained, no training.json written into OUT/vae

    layout, bench = Layout(out, 0, folder), SIZES[SIZE]
    trained: list[list[str]] = []
    monkeypatch.setattr(driver, "train_stage", lambda overrides: trained.append(overrides) or {"export": "x"})
    driver.train_ablation(layout, bench, "no_motion_scope", [])
    assert [compose_config("train", o).model.encoders.vae.path for o in trained] == [loaded, loaded]
    monkeypatch.setattr(driver, "evaluate_or_reuse", lambda cfg: cfg)  # the composed config, nothing played
    assert driver.evaluate_renderer(layout, bench, "a2", "mllm", "renderer").model.encoders.vae.path == loaded

    eval_out = tmp_path / "eval"
    eval_out.mkdir()
    (eval_out / "metrics.json").write_text(json.dumps({"metrics": {}}))
    summary = {"evaluation report": str(eval_out / "report.md"), "decoder base": None,
               "decoder base train/loss": None, "decoder base seconds": None}
    data = {TRUTH_WORDS_KEY: "level", "films": 2, "clips": 40, "split": {}, "sessions": {}, "rules": {},
            "motion": {"agreement": 1.0}}
    vae = driver.recipe_result(layout, bench, summary, data, [], {}, {})["vae"]
    assert (vae["held_out_psnr"], vae["total_steps"], vae["init"], vae["vae_from"]) == (
        HELD_OUT_PSNR, TOTAL_STEPS, FIRST_STAGE, loaded)
    assert vae["weights_sha256"] == json.loads((folder / TRAINING_RECORD).read_text())["weights_sha256"]
