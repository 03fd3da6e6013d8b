"""Evaluation never plays shots a model trained on, and the game renders at the trained clip size."""
from __future__ import annotations

from dataclasses import asdict, replace

import pytest
from conftest import quickstart_overrides
from omegaconf import OmegaConf

from animegamer.config.compose import compose_config, overrides_for, path_override
from animegamer.checkpoints.trained_data import ClipSize, lineage, trained_clip_size
from animegamer.evaluation.preflight import validate_eval_run
from animegamer.config.validate import ConfigError

QUICKSTART_CLIPS = ClipSize(frames=17, height=96, width=144, fps=8.0)  # configs/*/experiment/quickstart*.yaml


def _evaluation(root, summary, *extra):
    return compose_config("evaluate", [
        "experiment=quickstart_eval", *overrides_for("evaluate", quickstart_overrides(root)),
        path_override("evaluation.mllm_export", summary["phase b export"]),
        path_override("evaluation.renderer_export", summary["phase c export"]),
        path_override("evaluation.reconstruction_export", summary["phase a2 export"]), *extra])


def test_evaluation_refuses_a_larger_held_out_split_than_training(quickstart):
    root, summary = quickstart
    validate_eval_run(_evaluation(root, summary))  # every phase held out 0.2, as the evaluation does
    chain = [folder for folder, _ in lineage(summary["phase c export"])]
    assert chain == [summary["phase c export"], summary["phase a2 export"], summary["phase a start"]]

    with pytest.raises(ConfigError) as error:
        validate_eval_run(_evaluation(root, summary, "data.val_fraction=0.75"))
    problems = error.value.problems
    assert len(problems) == 3  # the MLLM, the renderer and the reconstruction export
    assert all("data.val_fraction=0.2" in p and "data.val_fraction=0.75" in p for p in problems)
    validate_eval_run(_evaluation(root, summary, "data.val_fraction=0.1"))  # a subset of the held-out shots


def test_evaluation_refuses_exports_trained_at_another_clip_size(quickstart, toy_run):
    """The toy_run pipeline cut the same toy film at 64x96: neither its clips nor its split fit."""
    root, summary = quickstart
    output, _ = toy_run
    with pytest.raises(ConfigError) as error:
        validate_eval_run(_evaluation(root, summary, f"data.root={output}"))
    sizes = [p for p in error.value.problems if "trained on clips of" in p]
    assert len(sizes) == 2 and all("17 frames of 144x96 at 8 fps" in p and "17 frames of 96x64" in p for p in sizes)


def test_game_renders_at_the_size_its_renderer_was_trained_at(quickstart, tmp_path):
    from animegamer.game.models import load_game_models, read_level_flow
    from animegamer.game.scheduler import play_game

    root, summary = quickstart
    assert trained_clip_size(summary["phase c export"]) == QUICKSTART_CLIPS
    cfg = OmegaConf.to_object(compose_config("train", ["model=tiny", "model.mllm.constrained_states=true"]))
    assert (cfg.pipeline.clips.height, cfg.pipeline.clips.width) == (480, 720)  # the preset's paper size
    models = load_game_models(cfg, summary["phase b export"], summary["phase c export"],
                              read_level_flow(root / "pipeline" / "clips"))
    record = play_game(models, ["Character: Qiqi; Motion: slowly walk; Background: morning forest."], tmp_path / "g",
                       sampling_steps=1)
    assert record["clips"] == {"fps": 8.0, "frames": 17, "height": 96, "width": 144}
    assert record["turns"][0]["frames"] == [17, 96, 144, 3]



def _cut(root, size: ClipSize) -> None:
    """A clip manifest as the pipeline writes it, as far as these checks read it: the clip size in its
    resolved config and the films' digests (cutting the same film again keeps them)."""
    from animegamer.checkpoints.trained_data import clip_manifest
    from animegamer.utils.io import write_json_atomic

    manifest = clip_manifest(root, "clips")
    manifest.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(manifest, {"config": {"pipeline": {"clips": {**asdict(size), "stride_seconds": 1.0}}},
                                 "sources": [{"path": "film.mp4", "sha256": "ab" * 32}]})


def _on(root, val_fraction=0.2):
    return compose_config("train", ["model=tiny", f"data.root={root}", f"data.val_fraction={val_fraction}"])


def test_an_export_keeps_the_data_it_trained_on_when_the_folder_is_cut_again(tmp_path, monkeypatch):
    """Like the quick start, the run records a relative data.root; the folder is cut again at another size
    after training; the export still says what it trained on, also from another directory."""
    from torch import nn

    from animegamer.checkpoints.export import save_export
    from animegamer.checkpoints.trained_data import at_clip_size, clip_size_of, renderer_clip_size, trained_data
    from animegamer.data.trained_data import clip_size_problems, split_problems

    trained_at, recut_at = QUICKSTART_CLIPS, replace(QUICKSTART_CLIPS, height=64, width=96)
    monkeypatch.chdir(tmp_path)
    _cut("data", trained_at)
    config = {"data": {"root": "data", "clips": "clips", "val_fraction": 0.2},
              "pipeline": {"clips": asdict(recut_at)}}  # only the manifest says what was trained on
    export = str(tmp_path / "export")
    save_export(export, nn.Linear(2, 2), {"config": config})
    assert trained_data(export)["root"] == str(tmp_path / "data")
    _cut("data", recut_at)

    assert trained_clip_size(export) == trained_at
    game_cfg = at_clip_size(OmegaConf.to_object(_on("data")), renderer_clip_size([export]))
    assert clip_size_of(game_cfg.pipeline.clips) == trained_at  # the game renders at the trained size
    [problem] = clip_size_problems(_on("data"), [("evaluation.renderer_export", export)])
    assert f"trained on clips of {trained_at}" in problem and f"are {recut_at} (the folder was cut again" in problem

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # the recorded root is absolute: the same folder, so the same split
    assert split_problems(_on(tmp_path / "data"), [("evaluation.mllm_export", export)]) == []
    [problem] = split_problems(_on(tmp_path / "data", 0.5), [("evaluation.mllm_export", export)])
    assert "was trained with data.val_fraction=0.2" in problem


def test_commands_given_exports_default_to_the_preset_they_were_trained_with(tmp_path):
    """The game CLI (and finetune) build the networks the exports fit unless a model= override says
    otherwise; an export that records no preset changes nothing."""
    import json

    from animegamer.checkpoints.trained_data import preset_overrides, trained_preset

    tiny, bare = tmp_path / "tiny", tmp_path / "bare"
    for folder, record in ((tiny, {"config": {"model": {"name": "tiny"}}}), (bare, {"step": 3})):
        folder.mkdir()
        (folder / "export.json").write_text(json.dumps(record))
    assert trained_preset(tiny) == "tiny" and trained_preset(bare) is None
    assert preset_overrides(["seed=1"], ["", str(bare), str(tiny)]) == ["model=tiny", "seed=1"]
    assert preset_overrides(["model=paper", "seed=1"], [str(tiny)]) == ["model=paper", "seed=1"]
    assert preset_overrides(["seed=1"], [str(bare)]) == ["seed=1"]


def test_an_exports_lineage_is_found_from_any_directory(tmp_path, monkeypatch):
    """A run started from ``phase.init_from=runs/a/export`` (relative to where it trained) records that
    export absolutely: the chain, and so the held-out split of every export in it, is read the same from
    another directory."""
    import json

    from animegamer.checkpoints.trained_data import trained_data_record
    from animegamer.contracts.files import EXPORT_FILE

    def write_export(folder, init_from):
        config = {"phase": {"init_from": init_from}, "data": {"root": "data", "clips": "clips"}}
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / EXPORT_FILE).write_text(json.dumps(
            {"config": config, "trained_data": trained_data_record(config)}))

    monkeypatch.chdir(tmp_path)  # where both runs trained
    write_export("runs/a/export", "")
    write_export("runs/b/export", "runs/a/export")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    chain = lineage(tmp_path / "runs" / "b" / "export")
    assert [folder for folder, _ in chain] == [str(tmp_path / "runs/b/export"), str(tmp_path / "runs/a/export")]


def test_the_clips_digest_ignores_how_the_command_that_cut_them_was_typed(tmp_path):
    """A run of the same clips with its overrides in another order rewrites the manifest's command, not its
    clips: evaluations and exports that recorded the digest must not see new data."""
    import json

    from animegamer.checkpoints.trained_data import clip_manifest_sha256
    from animegamer.evaluation.reuse import evaluation_fingerprint

    manifest = tmp_path / "clips" / "manifest.json"
    manifest.parent.mkdir()
    content = {"kind": "clips", "sources": [{"film_id": "f", "sha256": "aa"}], "counts": {"clips": 2},
               "shards": [{"name": "clips-000000.tar", "count": 2, "sha256": "bb"}], "motion_bins": {"edges": [1.0]}}

    def digest(**extra) -> str:
        manifest.write_text(json.dumps({**extra, **content}))
        return clip_manifest_sha256(tmp_path, "clips")

    first = digest(command="animegamer finetune a=1 b=2", config={"pipeline": {"a": 1, "b": 2}})
    assert digest(command="animegamer finetune b=2 a=1", config={"pipeline": {"b": 2, "a": 1}}) == first
    assert digest(command="animegamer finetune a=1 b=3", config={"pipeline": {"a": 1, "b": 3}}) != first
    evaluation = compose_config("evaluate", ["model=tiny", path_override("data.root", tmp_path)])
    digest(command="animegamer finetune a=1 b=2")
    before = evaluation_fingerprint(evaluation)
    digest(command="animegamer finetune b=2 a=1")
    assert evaluation_fingerprint(evaluation) == before
    content["shards"][0]["sha256"] = "cc"  # the clips cut again
    assert digest(command="animegamer finetune a=1 b=2") != first
    assert evaluation_fingerprint(evaluation) != before
