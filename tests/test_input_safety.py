"""Inputs a user hands us never escape their folder, never run code and never end in a traceback.

Game ids of a benchmark become folders: one that is not a plain name is refused before anything is
written. A checkpoint or export whose pickle needs code is refused through each entry point with its
message and exit code 2, and its payload (a marker file) never runs. A caption import names every bad
line (too deeply nested, not UTF-8, not JSON) with file:line, and warns about films it does not cover and
about records that overlap. The toy film refuses a user's films and captions given beside it. A
mistyped caption or export path is called missing.
"""
from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from animegamer.config.compose import compose_config
from animegamer.errors import USER_ERROR_EXIT_CODE, exit_on_user_error
from unsafe_helpers import REFUSED_PICKLE, Evil, marker  # noqa: F401 - marker is a fixture

REPO = Path(__file__).resolve().parents[1]
NOT_SAFETENSORS = "not a safetensors file"


def exit_of(func, *args, capfd) -> tuple[int, str]:
    """Run an entry point function as its command does: (exit code, stderr)."""
    capfd.readouterr()
    with pytest.raises(SystemExit) as stopped:
        exit_on_user_error(func)(*args)
    return stopped.value.code, capfd.readouterr().err


# --------------------------------------------------------------------------- game ids become folders
@pytest.mark.parametrize("name", ["../../../x", "a/b", "..", ".", "a\\b", "x\0y", "", 7])
def test_a_name_that_is_not_one_path_component_is_refused(name):
    from animegamer.evaluation.benchmark import plain_name_problem

    assert plain_name_problem(name) is not None


@pytest.mark.parametrize("name", ["toyfilm-000003", "game 1", "...x", "épisode_1"])
def test_a_plain_name_is_accepted(name):
    from animegamer.evaluation.benchmark import plain_name_problem

    assert plain_name_problem(name) is None


def _benchmark(path: Path, ids: list, turn_key: str = "toyfilm-000001") -> Path:
    games = [{"id": game_id, "turns": [{"key": turn_key, "instruction": "walk", "environment": "park", "level": 1,
                                        "states": {"ML": 1, "SC": 0, "ET": 0, "ST": 1}}]} for game_id in ids]
    path.write_text(json.dumps({"games": games}))
    return path


def _victim(tmp_path: Path) -> Path:
    """A folder outside evaluation.out holding a game that ``../../../victim`` would overwrite."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "game.json").write_text("{}")
    (victim / "turn_000.mp4").write_bytes(b"clip")
    return victim


def test_evaluate_py_refuses_game_ids_outside_its_folder_in_the_preflight(tmp_path, capfd):
    from animegamer.evaluation.runner import run

    victim = _victim(tmp_path)
    out = tmp_path / "eval" / "out"
    benchmark = _benchmark(tmp_path / "bench.json", ["../../../victim", "a/b", "fine"], turn_key="../k")
    composed = compose_config("evaluate", ["model=tiny", f"data.root={tmp_path / 'data'}",
                                           f"evaluation.benchmark={benchmark}", f"evaluation.out={out}"])
    code, err = exit_of(run, composed, capfd=capfd)
    assert code == USER_ERROR_EXIT_CODE and "Traceback" not in err, err
    assert f"{benchmark}: game 1 id '../../../victim' is not a plain name" in err, err
    assert f"{benchmark}: game 2 id 'a/b' is not a plain name" in err
    assert f"{benchmark}: game 1 turn 1 key '../k' is not a plain name" in err
    assert "'fine'" not in err
    assert not (tmp_path / "eval").exists()
    assert sorted(p.name for p in victim.iterdir()) == ["game.json", "turn_000.mp4"]


def test_evaluate_refuses_bad_ids_before_writing_even_unvalidated(tmp_path):
    """The library call (what the recipe's evaluation runs after its own checks) refuses the file too."""
    from omegaconf import OmegaConf

    from animegamer.errors import InvalidInputError
    from animegamer.evaluation.runner import evaluate

    victim = _victim(tmp_path)
    out = tmp_path / "eval" / "out"
    benchmark = _benchmark(tmp_path / "bench.json", ["../../../victim"])
    cfg = OmegaConf.to_object(compose_config("evaluate", ["model=tiny", f"evaluation.benchmark={benchmark}",
                                                          f"evaluation.out={out}"]))
    with pytest.raises(InvalidInputError, match=r"game 1 id '\.\./\.\./\.\./victim' is not a plain name"):
        evaluate(cfg)
    assert not (tmp_path / "eval").exists()
    assert (victim / "game.json").read_text() == "{}"


def test_held_out_games_with_a_clip_key_outside_the_folder_are_refused(tmp_path, monkeypatch):
    """Clip shards made elsewhere: their keys name the games' folders too."""
    from omegaconf import OmegaConf

    from animegamer.evaluation import runner as evaluation
    from animegamer.errors import InvalidInputError

    shards = str(tmp_path / "data" / "clips")
    monkeypatch.setattr(evaluation, "held_out_games", lambda cfg: {"source": shards, "games": [
        {"id": "../../x", "turns": [{"key": "../../x", "instruction": "walk"}]}]})
    out = tmp_path / "eval" / "out"
    cfg = OmegaConf.to_object(compose_config("evaluate", ["model=tiny", f"evaluation.out={out}"]))
    with pytest.raises(InvalidInputError) as caught:
        evaluation.evaluate(cfg)
    assert f"{shards}: game 1 id '../../x'" in str(caught.value)
    assert f"{shards}: game 1 turn 1 key '../../x'" in str(caught.value)
    assert not (tmp_path / "eval").exists()


@pytest.mark.parametrize("content, reason", [
    ("{not json", "not a readable JSON file"),
    ("[" * 100_000 + "]" * 100_000, "not a readable JSON file"),
    ('{"games": {"id": "x"}}', "not a benchmark"),
    ('{"games": [{"id": "x"}]}', "game 1 is not an object with \"id\" and a \"turns\" list"),
])
def test_a_benchmark_file_that_cannot_be_played_is_named_with_its_reason(tmp_path, content, reason):
    from animegamer.evaluation.benchmark import benchmark_file_problems

    path = tmp_path / "bench.json"
    path.write_text(content)
    [problem] = benchmark_file_problems(path)
    assert str(path) in problem and reason in problem, problem


# --------------------------------------------------------------------------- refused checkpoints
def _evil_checkpoint(path: Path, marker: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"state_dict": {"w": torch.zeros(2)}, "global_step": 3, "callbacks": {"x": Evil(marker)}}, path)
    return path


def test_train_py_resuming_from_a_malicious_checkpoint_exits_2_and_runs_nothing(tmp_path, marker):
    """The real entry point: the refused checkpoint is named, exit code 2, no traceback, the payload never ran
    and nothing was built (no export, no run record)."""
    from phase_a_helpers import write_synthetic_features

    data = write_synthetic_features(tmp_path / "data", compose_config("train", ["model=tiny"]).model.encoders, clips=4)
    run = tmp_path / "run"
    checkpoint = _evil_checkpoint(run / "checkpoints" / "step-0000003.ckpt", marker)
    done = subprocess.run(
        [sys.executable, str(REPO / "train.py"), "model=tiny", "trainer=cpu", "logger=none", f"data.root={data}",
         f"output_dir={run}", "phase.max_steps=6", "phase.batch_size=2", "phase.val_clips=0",
         "data.val_fraction=0.2"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == USER_ERROR_EXIT_CODE, done.stderr[-3000:]
    assert f"error: {checkpoint}: {REFUSED_PICKLE}" in done.stderr and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert not (run / "export").exists() and not (run / "run_config.json").exists()


def _evil_export(folder: Path, marker: Path) -> Path:
    folder.mkdir()
    torch.save({"weight": Evil(marker)}, folder / "trained.safetensors")
    return folder


def _level_flow_manifest(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "manifest.json").write_text(json.dumps({"motion_bins": {"level_flow": {str(k): float(k) for k in range(1, 6)}}}))
    return folder / "manifest.json"


def test_game_refuses_a_pickle_in_place_of_an_export(tmp_path, marker, capfd):
    """``python -m animegamer.game`` over an export whose tensors file is a pickle: exit code 2, the file
    named, the payload never ran (exports are read as safetensors only)."""
    from animegamer.game.cli import main

    evil = _evil_export(tmp_path / "evil_export", marker)
    script = tmp_path / "turns.txt"
    script.write_text("walk\n")
    argv = ["--mllm", str(evil), "--renderer", str(evil), "--clips-manifest",
            str(_level_flow_manifest(tmp_path / "clips")), "--instructions", str(script), "--out", str(tmp_path / "game"),
            "--device", "cpu", "model=tiny"]
    code, err = exit_of(main, argv, capfd=capfd)
    assert code == USER_ERROR_EXIT_CODE and "Traceback" not in err, err
    assert f"error: {evil / 'trained.safetensors'}: {NOT_SAFETENSORS}" in err, err
    assert not (tmp_path / "game" / "game.json").exists()


def test_a_renderer_export_holding_a_pickle_is_refused(tmp_path, marker):
    """The renderer's loader (game, evaluation and the pipeline's representations) reads the export's tensor
    names first: a pickle there is refused as a user error before any tensor is read."""
    from omegaconf import OmegaConf

    from animegamer.errors import UnsafeCheckpointError
    from animegamer.models.reconstruction import build_reconstruction

    evil = _evil_export(tmp_path / "evil_export", marker)
    cfg = OmegaConf.to_object(compose_config("train", ["model=tiny"]))
    with pytest.raises(UnsafeCheckpointError, match=f"{evil / 'trained.safetensors'}: {NOT_SAFETENSORS}"):
        build_reconstruction(cfg, [evil])


# --------------------------------------------------------------------------- caption imports
def _record(film: str, start: float, end: float) -> dict:
    return {"film": film, "start": start, "end": end, "character": "Qiqi", "motion": "walk", "adverb": "slowly",
            "environment": "park", "time_of_day": "day", "states": {"SC": 0, "ET": 1, "ST": -1}}


def _run_captioner(path: Path, films: dict[str, str]):
    from animegamer.config.schema import CaptionConfig, PipelineConfig
    from data_pipeline.preflight import build_run_captioner

    return build_run_captioner(PipelineConfig(caption=CaptionConfig(backend="jsonl", path=str(path))), films)


def test_every_bad_caption_line_is_named_with_file_line_and_reason(tmp_path):
    from animegamer.config.validate import ConfigError

    folder = tmp_path / "captions"
    folder.mkdir()
    good = json.dumps(_record("ep01", 0, 5))
    (folder / "a.jsonl").write_bytes("\n".join([good, "[" * 100_000 + "]" * 100_000, "{not json", good]).encode())
    (folder / "b.jsonl").write_bytes(b"\n" + json.dumps(_record("ep01", 5, 9)).encode()[:-3] + b"\xff\xfe\"}\n"
                                     + json.dumps({**_record("ep01", 5, 9), "end": 1}).encode())
    with pytest.raises(ConfigError) as caught:
        _run_captioner(folder, {"ep01": str(tmp_path / "ep01.mp4")})
    problems = caught.value.problems
    assert len(problems) == 4, problems
    expected = [(folder / "a.jsonl", 2, "nested too deeply"), (folder / "a.jsonl", 3, "invalid JSON"),
                (folder / "b.jsonl", 2, "not UTF-8 text (byte 0xff"), (folder / "b.jsonl", 3, "'end' (1.0) must be greater")]
    for problem, (file, line, reason) in zip(problems, expected):
        assert f"{file}:{line}: " in problem and reason in problem, problem


def test_films_without_records_and_overlapping_records_are_warned_about_once(tmp_path, caplog):
    path = tmp_path / "c.jsonl"
    lines = [_record("ep01", 0, 10), _record("ep01.mkv", 8, 12), _record("ep01", 12, 20), _record("ep02", 0, 5)]
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    films = {str(tmp_path / f"{name}.mkv"): name for name in ("ep01", "ep02", "ep03", "ep04")}  # path -> id
    with caplog.at_level(logging.WARNING, logger="data_pipeline.captioners"):
        captioner = _run_captioner(path, films)
    missing = [m for m in caplog.messages if "has no caption record" in m]
    assert len(missing) == 2 and "'ep03'" in missing[0] and "'ep04'" in missing[1], missing
    overlaps = [m for m in caplog.messages if "overlap" in m]
    assert len(overlaps) == 1 and overlaps[0].count(" overlaps ") == 1, overlaps
    assert f"{path}:2 [8.00, 12.00) overlaps {path}:1 [0.00, 10.00)" in overlaps[0]
    assert captioner.find_record("ep01", 9.0).source == f"{path}:2"  # warned, still the later start


def test_a_worker_captioner_warns_about_nothing(tmp_path, caplog):
    from animegamer.config.schema import CaptionConfig
    from data_pipeline.captioners.registry import build_captioner

    path = tmp_path / "c.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in (_record("ep01", 0, 10), _record("ep01", 5, 12))))
    with caplog.at_level(logging.WARNING, logger="data_pipeline.captioners"):
        build_captioner(CaptionConfig(backend="jsonl", path=str(path)), {"ep02": "/films/ep02.mkv"},
                        warn_unknown_films=False)
    assert caplog.messages == []


# --------------------------------------------------------------------------- the toy film and missing paths
@pytest.mark.parametrize("given, named", [
    (["pipeline.inputs=[/films/ep01.mkv]"], "pipeline.inputs=['/films/ep01.mkv']"),
    (["pipeline.caption.path=/films/captions.jsonl"], "pipeline.caption.path='/films/captions.jsonl'"),
])
def test_the_toy_film_refuses_the_users_films_and_captions(tmp_path, capfd, given, named):
    from data_pipeline.__main__ import run

    output = tmp_path / "out"
    composed = compose_config("pipeline", ["source=toy", f"pipeline.output={output}", *given])
    code, err = exit_of(run, composed, capfd=capfd)
    assert code == USER_ERROR_EXIT_CODE and "Traceback" not in err, err
    assert f"pipeline.toy_film=true (source=toy, the default) replaces {named}" in err, err
    assert f"add source=films" in err and f"drop {named}" in err
    assert not output.exists()


def test_the_toy_film_alone_and_films_alone_pass(tmp_path):
    from animegamer.config.validate import check_pipeline
    from animegamer.config.schema import CaptionConfig, PipelineConfig

    assert not [p for p in check_pipeline(PipelineConfig(toy_film=True, caption=CaptionConfig(backend="jsonl")))
                if "toy_film" in p]
    captions = tmp_path / "c.jsonl"
    captions.write_text("")
    films = PipelineConfig(inputs=["/films"], caption=CaptionConfig(backend="jsonl", path=str(captions)))
    assert not [p for p in check_pipeline(films) if "toy_film" in p]
    later = PipelineConfig(toy_film=True, inputs=["/films"], steps=["sessions"])  # reads no film
    assert not [p for p in check_pipeline(later) if "toy_film" in p]


def test_a_mistyped_caption_path_does_not_exist(tmp_path):
    from animegamer.config.schema import CaptionConfig, PipelineConfig
    from animegamer.config.validate import check_pipeline
    from data_pipeline.captioners.jsonl import caption_files

    missing = tmp_path / "captons.jsonl"
    problems = check_pipeline(PipelineConfig(inputs=["/films"], caption=CaptionConfig(backend="jsonl", path=str(missing))))
    assert [p for p in problems if "pipeline.caption.path" in p] == [
        f"pipeline.caption.path='{missing}': {missing} does not exist (the jsonl backend reads a caption file or a "
        f"folder of them)"]
    with pytest.raises(FileNotFoundError, match=f"{missing} does not exist"):
        caption_files(missing)


def test_a_mistyped_export_path_does_not_exist(tmp_path):
    from animegamer.evaluation.preflight import validate_eval_run
    from data_pipeline.config_checks import validate_pipeline_run
    from animegamer.config.validate import ConfigError

    missing = tmp_path / "b" / "exprot"
    empty = tmp_path / "empty"
    empty.mkdir()
    evaluation = compose_config("evaluate", ["model=tiny", f"data.root={tmp_path}", f"evaluation.mllm_export={missing}",
                                             f"evaluation.renderer_export={empty}"])
    with pytest.raises(ConfigError) as caught:
        validate_eval_run(evaluation)
    problems = caught.value.problems
    assert f"evaluation.mllm_export='{missing}': not an export folder: {missing} does not exist (train the phase first)" \
        in problems, problems
    assert f"evaluation.renderer_export='{empty}': not an export folder: {empty} holds no trained.safetensors " \
           f"(train the phase first)" in problems, problems
    pipeline = compose_config("pipeline", ["experiment=quickstart", f"pipeline.adaptation.export={missing}"])
    with pytest.raises(ConfigError) as caught:
        validate_pipeline_run(pipeline)
    assert caught.value.problems == [
        f"pipeline.adaptation.export='{missing}': not a phase (b) export folder: {missing} does not exist"]


def test_a_mistyped_finetune_start_does_not_exist(tmp_path):
    from animegamer.errors import MissingInputError
    from animegamer.finetune import finetune_recipe

    with pytest.raises(MissingInputError, match=f"{tmp_path / 'nowhere' / 'a_joint' / 'export'} does not exist"):
        finetune_recipe("f.mp4", "f.jsonl", tmp_path / "nowhere", tmp_path / "out", "tiny", (1, 1, 1))


def test_a_caption_file_of_other_films_stops_the_run_before_any_clip_is_cut():
    """Every clip would fail to caption and the run would stop only after cutting them all; films the ingest
    rejected are left to the report, which names each with its reason."""
    from types import SimpleNamespace

    from animegamer.config.schema import CaptionConfig, PipelineConfig
    from animegamer.config.validate import ConfigError
    from data_pipeline.run import refuse_uncaptionable

    captioner = SimpleNamespace(films_without_records=lambda: ["bikes", "carphone"])
    cfg = PipelineConfig(caption=CaptionConfig(backend="jsonl", path="other.jsonl"))
    with pytest.raises(ConfigError) as caught:
        refuse_uncaptionable(cfg, ["carphone", "bikes"], captioner)
    [problem] = caught.value.problems
    assert problem.startswith("pipeline.caption.path=other.jsonl: no caption record names any of the films "
                              "(bikes, carphone;"), problem
    refuse_uncaptionable(cfg, [], captioner)  # every input rejected: the report says why
    refuse_uncaptionable(cfg, ["bikes", "kiki"], SimpleNamespace(films_without_records=lambda: ["bikes"]))
    accepting = PipelineConfig(caption=CaptionConfig(backend="jsonl", path="other.jsonl", min_captioned_share=0.0))
    refuse_uncaptionable(accepting, ["bikes"], captioner)
