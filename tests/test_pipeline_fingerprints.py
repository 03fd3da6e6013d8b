"""What the pipeline's fingerprints hold: each step's staged work is redone only when something it
reads changed, and a task's old error never outlives the clips staged after it."""
from __future__ import annotations

from dataclasses import replace

from animegamer.config.schema import ModelConfig, PipelineConfig
from data_pipeline.adaptation import model_settings
from data_pipeline.fingerprint import plan_fingerprint
from data_pipeline.staging import Staging


def test_plan_fingerprint_holds_only_what_probing_and_the_detector_read(tmp_path):
    film = tmp_path / "film.mp4"
    film.write_bytes(b"not decoded here")
    cfg = PipelineConfig(output=str(tmp_path / "out"))
    cache = Staging(tmp_path / "out").hash_cache

    def plan_fp(**changes) -> str:
        sections = {name: replace(getattr(cfg, name), **fields) for name, fields in changes.items()}
        return plan_fingerprint(film, replace(cfg, **sections), cache)

    assert cfg.shots.detector == "content"
    base = plan_fp()
    assert plan_fp(ingest={"extensions": [".mkv"]}) == base  # decides which files are found, not their plan
    assert plan_fp(shots={"adaptive_threshold": cfg.shots.adaptive_threshold + 1}) == base  # the other detector's
    assert plan_fp(shots={"threshold": cfg.shots.threshold + 1}) != base
    assert plan_fp(shots={"detector": "adaptive"}) != base
    assert plan_fp(ingest={"min_side": cfg.ingest.min_side + 1}) != base


def test_adaptation_ignores_performance_only_model_switches():
    model = ModelConfig()
    fast = replace(model, mllm=replace(model.mllm, compile=True, gradient_checkpointing=True),
                   decoder=replace(model.decoder, compile=True))
    assert model_settings(fast) == model_settings(model)
    larger = replace(model, mllm=replace(model.mllm, num_hidden_layers=model.mllm.num_hidden_layers + 1))
    assert model_settings(larger) != model_settings(model)


def test_staging_new_clips_clears_an_old_task_error(tmp_path):
    """A run that dies after staging a task's clips, before its captions: the task is pending, not failed."""
    staging = Staging(tmp_path)
    staging.write_task_error("film", 0, {"reason": "decode_error"})
    staging.write_task("film", 0, [], {"task": 0})
    assert staging.task_done("film", 0) and staging.task_error("film", 0) is None
