"""The fine-tune's command line without training: its help names every default, its schedule is a share
of what --from's exports trained (with what it will cost), a refusal to resume names --out, and a game
that played nothing ends the command with exit code 1 and the way on."""
from __future__ import annotations

import json
import math
import shutil
import sys
from pathlib import Path

import pytest

from animegamer import finetune
from animegamer.config.compose import compose_config
from animegamer.finetune import (FAILED, FINETUNED, NOTHING_PLAYED_EXIT_CODE, STEP_SHARES, finetune_recipe, schedules,
                                 trained_steps)
from animegamer.phases.specs import A_JOINT, PHASE_B, PHASE_C

CLIP_SIZE = {"frames": 17, "height": 96, "width": 144, "fps": 8.0}


def write_export(folder: Path, phase: str, step: int, seconds: float | None, init_from: str = "") -> Path:
    """An export.json as training writes it (its tensors are not needed here)."""
    folder.mkdir(parents=True, exist_ok=True)
    record = {"config": {"model": {"name": "tiny"}, "phase": {"name": phase, "init_from": init_from}},
              "trained_data": {"clip_size": CLIP_SIZE}, "step": step, "max_steps": step}
    if seconds is not None:
        record["train_seconds"] = seconds
    (folder / "export.json").write_text(json.dumps(record))
    return folder


@pytest.fixture
def start(tmp_path) -> Path:
    """A --from run folder like the quick start's: a2 60 steps in 30 s, b 300 in 60 s, c 40 in 8 s."""
    root = tmp_path / "quickstart"
    for phase, step, seconds in ((A_JOINT, 60, 30.0), (PHASE_B, 300, 60.0), (PHASE_C, 40, 8.0)):
        write_export(root / phase / "export", phase, step, seconds)
    return root


def test_help_names_every_default(capsys):
    with pytest.raises(SystemExit) as done:
        finetune.main(["--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    shares = ", ".join(f"{STEP_SHARES[p]} ({p})" for p in FINETUNED)
    assert f"--steps A2 B C phase.max_steps of phases (a2), (b) and (c) (default: {shares} of the steps each " \
           f"--from export trained, at least 1; the log says what they will cost)" in text
    assert "(default: the one --from's exports were trained with, else paper)" in text
    assert "(default: --from's b/export)" in text and "(default: free decoding" in text


def test_default_steps_are_shares_of_what_the_exports_trained_with_their_cost(start):
    plan = schedules(start, "tiny")
    expected = [math.ceil(n * STEP_SHARES[p]) for p, n in zip(FINETUNED, (60, 300, 40))]
    assert [s.steps for s in plan] == expected == [2, 30, 4]
    assert [s.seconds for s in plan] == pytest.approx([2 * 0.5, 30 * 0.2, 4 * 0.2])
    assert plan[1].basis == f"1/10 of the 300 steps {start / PHASE_B / 'export'} trained"
    # --steps as given, still priced at the exports' pace
    given = schedules(start, "tiny", steps=(10, 20, 30))
    assert [(s.steps, s.basis) for s in given] == [(10, "--steps"), (20, "--steps"), (30, "--steps")]
    assert [s.seconds for s in given] == pytest.approx([5.0, 4.0, 6.0])


def test_a_paper_scale_start_and_a_fine_tune_of_a_fine_tune_keep_the_full_schedule(tmp_path):
    """The share is of the longest run of the phase along the exports' starts: fine-tuning a fine-tune does
    not shrink the schedule again."""
    paper = write_export(tmp_path / "paper" / A_JOINT / "export", A_JOINT, 80_000, None)
    first = write_export(tmp_path / "ft1" / A_JOINT / "export", A_JOINT, 2_000, 400.0, init_from=str(paper))
    assert trained_steps(first, A_JOINT) == (80_000, str(paper), None)
    assert trained_steps(tmp_path / "nothing", A_JOINT) is None


def test_without_an_export_the_configured_schedule_is_shared(start):
    """Phase (b) from the official MLLM: its --from b/export is not what it starts from."""
    plan = schedules(start, "tiny", official_mllm="pytorch_model.bin")
    configured = compose_config("train", ["model=tiny", "phase=b"]).phase.max_steps
    assert plan[1].steps == math.ceil(configured * STEP_SHARES[PHASE_B]) and plan[1].seconds is None
    assert f"configured {configured}" in plan[1].basis
    assert [plan[0].steps, plan[2].steps] == [2, 4]


def _run(monkeypatch, argv: list[str], summary: dict) -> list:
    """main(argv) with the recipe replaced by one that returns ``summary``; returns the recipes it got."""
    recipes = []
    monkeypatch.setattr(finetune, "run_recipe", lambda recipe: recipes.append(recipe) or dict(summary))
    monkeypatch.setattr(finetune, "setup_logging", lambda level: None)  # keeps caplog's handler on the root logger
    monkeypatch.setattr(sys, "argv", ["animegamer-finetune", *argv])
    return recipes


def test_the_schedule_and_its_cost_are_logged_before_training(start, tmp_path, monkeypatch, caplog):
    argv = ["--film", "f.mp4", "--captions", "f.jsonl", "--from", str(start), "--out", str(tmp_path / "ft")]
    recipes = _run(monkeypatch, argv, {"evaluation turns planned": 4, "evaluation turns played": 4})
    with caplog.at_level("INFO", logger=finetune.log.name):
        summary = finetune.main(argv)
    assert FAILED not in summary
    [recipe] = recipes
    assert "phase.max_steps=2" in recipe.phase_a and "phase.max_steps=30" in recipe.phase_b
    assert "phase.max_steps=4" in recipe.phase_c
    assert "phase b 30 step(s) (1/10 of the 300 steps" in caplog.text and "about 6 s at the pace" in caplog.text
    assert "about 8 s of training in all" in caplog.text


@pytest.mark.parametrize("constrained", [False, True])
def test_a_game_that_played_nothing_exits_1_with_the_way_on(start, tmp_path, monkeypatch, caplog, constrained):
    argv = ["--film", "f.mp4", "--captions", "f.jsonl", "--from", str(start), "--out", str(tmp_path / "ft"),
            *(["--constrained-states"] if constrained else [])]
    _run(monkeypatch, argv, {"evaluation turns planned": 4, "evaluation turns played": 0,
                             "demonstration game turns planned": 5, "demonstration game turns played": 0})
    with caplog.at_level("ERROR", logger=finetune.log.name), pytest.raises(SystemExit) as done:
        finetune.cli()
    assert done.value.code == NOTHING_PLAYED_EXIT_CODE == 1
    assert "the evaluation (0 of 4 turns) and the demonstration game (0 of 5 turns)" in caplog.text
    assert ("--constrained-states" in caplog.text) is not constrained and "--steps" in caplog.text


def test_a_game_that_played_exits_0(start, tmp_path, monkeypatch):
    argv = ["--film", "f.mp4", "--captions", "f.jsonl", "--from", str(start), "--out", str(tmp_path / "ft")]
    _run(monkeypatch, argv, {"evaluation turns planned": 4, "evaluation turns played": 1,
                             "demonstration game turns planned": 5, "demonstration game turns played": 5})
    assert finetune.cli() is None


def test_a_refusal_to_resume_names_out_not_output_dir(start, tmp_path, monkeypatch):
    """An output_dir override would put every stage of the fine-tune into one folder."""
    from animegamer import recipe
    from animegamer.recipe import OUT_NEW_FOLDER
    from animegamer.phases import run as runner
    from animegamer.training.run_record import Change, RunFolderChanged

    folder = tmp_path / "ft" / "b"
    refusal = RunFolderChanged(folder, folder / "run_config.json", [(Change("phase.lr", 1, 2), "changes it")])

    def refuse(composed):
        raise refusal

    monkeypatch.setattr(runner, "run", refuse)
    made = finetune_recipe("f.mp4", "f.jsonl", start, tmp_path / "ft", "tiny", (2, 30, 4))
    with pytest.raises(RunFolderChanged) as error:
        recipe.train_stage(["phase=b", f"output_dir={folder}"], made.new_folder)
    assert f"train into a new folder ({OUT_NEW_FOLDER})" in str(error.value) and "output_dir" not in str(error.value)
    assert "phase.lr: 1 (recorded) -> 2 (now)" in str(error.value)


# --------------------------------------------------------------------------- the command line's own checks
def test_help_names_every_preset_and_the_overrides(capsys):
    """The presets are configs/model/'s (small included), --captions may be left out for a captioning
    backend, and the usage line shows the key=value overrides."""
    with pytest.raises(SystemExit):
        finetune.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "[--model {paper,small,tiny}]" in text and "[--captions CAPTIONS]" in text
    assert "[--constrained-states] [key=value ...]" in text and "key=value: a Hydra override for every stage" in text
    assert "--from RUN" in text


def _refusal(monkeypatch, capsys, argv: list[str]) -> str:
    """The message of the command's exit 2, checked to come before the recipe runs."""
    recipes = _run(monkeypatch, argv, {})
    with pytest.raises(SystemExit) as done:
        finetune.cli()
    assert done.value.code == 2 and not recipes
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return " ".join(err.split())


HARD_PATHS = ["Howl's Castle.mp4", "a\\'b\\", "x${y}z [1], {2} (3) = \"4\"", "Château d'été.mp4"]


@pytest.mark.parametrize("name", HARD_PATHS)
def test_any_film_and_caption_path_reaches_the_pipeline_as_it_is(start, tmp_path, name):
    film, captions = tmp_path / name, tmp_path / f"{name}.jsonl"
    made = finetune_recipe(str(film), str(captions), start, tmp_path / "ft", "tiny", (1, 1, 1),
                           official_mllm=str(tmp_path / name))
    cfg = compose_config("pipeline", made.pipeline)
    assert list(cfg.pipeline.inputs) == [str(film)] and cfg.pipeline.caption.path == str(captions)
    assert compose_config("train", made.phase_b).model.mllm.official_checkpoint == str(tmp_path / name)


def test_out_and_from_folders_of_any_name_reach_every_stage_as_they_are(start, tmp_path):
    """The recipe passes the folders under --out and --from quoted: a quote, a comma, brackets or an
    interpolation in their names read back exactly in every stage (the run itself: test_quickstart_finetune)."""
    from animegamer.config.compose import path_override

    hard = tmp_path / "Howl's run, [2] ${x}"
    shutil.copytree(start, hard / "from")
    made = finetune_recipe(str(tmp_path / "f.mp4"), str(tmp_path / "f.jsonl"), hard / "from", hard / "out", "tiny",
                           (1, 1, 1))
    assert compose_config("pipeline", made.pipeline).pipeline.output == str(hard / "out" / "pipeline")
    for stage, phase in ((made.phase_a, "a_joint"), (made.phase_b, "b"), (made.phase_c, "c")):
        assert compose_config("train", stage).output_dir == str(hard / "out" / phase)
    starts = compose_config("train", [*made.phase_a, path_override("phase.init_from", made.start_a)])
    assert starts.phase.init_from == str(hard / "from" / "a_joint" / "export")  # as the recipe passes it on


def test_the_captions_are_left_out_for_a_captioning_backend(start, tmp_path, monkeypatch, capsys):
    argv = ["--film", "f.mp4", "--from", str(start), "--out", str(tmp_path / "ft")]
    err = _refusal(monkeypatch, capsys, argv)
    assert "--captions: missing: name the film's caption file" in err and "pipeline.caption.backend=vlm" in err
    err = _refusal(monkeypatch, capsys, [*argv, "--captions", "f.jsonl", "pipeline.caption.backend=vlm"])
    assert "--captions 'f.jsonl' is a caption import, but pipeline.caption.backend=vlm captions the clips" in err
    recipes = _run(monkeypatch, [*argv, "pipeline.caption.backend=vlm"], {})
    finetune.cli()
    [recipe] = recipes
    assert not any(o.startswith("pipeline.caption.path") for o in recipe.pipeline)
    cfg = compose_config("pipeline", [*recipe.pipeline, *recipe.extra])
    assert cfg.pipeline.caption.backend == "vlm" and cfg.pipeline.caption.path == ""


def test_out_naming_the_start_folder_is_refused_before_anything_is_written(start, tmp_path, monkeypatch, capsys):
    """The fine-tune would cut its film into the start's own pipeline folder and train over its runs."""
    before = sorted(p.relative_to(start) for p in start.rglob("*"))
    for out in (start, start / ".." / start.name):
        err = _refusal(monkeypatch, capsys, ["--film", "f.mp4", "--captions", "f.jsonl", "--from", str(start),
                                             "--out", str(out)])
        assert f"--out {out}: the same folder as --from" in err and "give it a folder of its own" in err
    assert sorted(p.relative_to(start) for p in start.rglob("*")) == before


def test_ctrl_c_outside_a_training_step_ends_the_command_with_a_line_not_a_traceback(start, tmp_path, monkeypatch,
                                                                                      capsys):
    """The recipe runs the pipeline and the evaluation in the command's own process: Ctrl-C there (clip cutting,
    say) reaches the entry point, which says what is kept and how to go on, with the shell's code for it."""
    from animegamer.errors import INTERRUPTED_EXIT_CODE, INTERRUPTED_MESSAGE

    def cutting(recipe):
        raise KeyboardInterrupt

    _run(monkeypatch, ["--film", "f.mp4", "--captions", "f.jsonl", "--from", str(start), "--out",
                       str(tmp_path / "ft")], {})
    monkeypatch.setattr(finetune, "run_recipe", cutting)
    caught = None
    try:
        finetune.cli()
    except BaseException as error:  # noqa: BLE001 - a KeyboardInterrupt here must fail the test, not stop pytest
        caught = error
    assert isinstance(caught, SystemExit) and caught.code == INTERRUPTED_EXIT_CODE == 130, caught
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == INTERRUPTED_MESSAGE and "Traceback" not in err


def test_the_frozen_folders_the_exports_were_trained_over_are_loaded(tmp_path, monkeypatch):
    """A small preset's exports fit the VAE and decoder base they trained over; an override still wins."""
    export = write_export(tmp_path / "small" / A_JOINT / "export", A_JOINT, 40, None)
    record = json.loads((export / "export.json").read_text())
    record["config"]["model"] = {"name": "small", "encoders": {"vae": {"path": "/runs/vae"}},
                                 "decoder": {"path": "/runs/base/transformer"}}
    (export / "export.json").write_text(json.dumps(record))
    assert finetune.frozen_folder_overrides(export.parent.parent, "small", []) == [
        "model.encoders.vae.path='/runs/vae'", "model.decoder.path='/runs/base/transformer'"]
    assert finetune.frozen_folder_overrides(export.parent.parent, "small", ["model.decoder.path=/mine"]) == [
        "model.encoders.vae.path='/runs/vae'"]


# --------------------------------------------------------------------------- the held-out split of --from's films
def trained_on(tmp_path: Path, films: list[Path], val_fraction: float = 0.2, root: Path | None = None) -> Path:
    """A --from run folder whose a_joint export (started from an a_warmup export) and b export trained on
    ``films`` in the data folder ``root`` (another run's pipeline output by default)."""
    from animegamer.utils.io import sha256_file

    root = root or tmp_path / "earlier" / "pipeline"
    if not (root / "clips" / "manifest.json").exists():
        (root / "clips").mkdir(parents=True)
        (root / "clips" / "manifest.json").write_text(json.dumps({"sources": [
            {"film_id": f.stem, "path": str(f), "sha256": sha256_file(f), "size": f.stat().st_size} for f in films]}))
    run = tmp_path / "earlier_run"
    data = {"root": str(root), "clips": "clips", "val_fraction": val_fraction}
    warmup = write_export(run / "a_warmup" / "export", "a_warmup", 10, None)
    for phase, init in ((A_JOINT, str(warmup)), (PHASE_B, ""), (PHASE_C, "")):
        write_export(run / phase / "export", phase, 40, 4.0, init_from=init)
    for folder in (warmup, *(run / p / "export" for p in (A_JOINT, PHASE_B, PHASE_C))):
        record = json.loads((folder / "export.json").read_text())
        record["config"]["data"] = data
        record["trained_data"] = {"root": str(root), "clips": "clips", "clip_size": CLIP_SIZE}
        (folder / "export.json").write_text(json.dumps(record))
    return run


@pytest.fixture
def films(tmp_path) -> Path:
    folder = tmp_path / "films"
    folder.mkdir()
    for name, body in (("bikes.mp4", b"bikes" * 100), ("carphone.mp4", b"carphone" * 100)):
        (folder / name).write_bytes(body)
    return folder


def test_films_the_start_trained_on_elsewhere_are_refused_before_anything_is_cut(tmp_path, films, monkeypatch,
                                                                                 capsys):
    """Another data folder split them otherwise: the evaluation would play shots the model trained on. One
    problem names every export that trained there (the a_warmup one a_joint started from too)."""
    run = trained_on(tmp_path, sorted(films.iterdir()))
    err = _refusal(monkeypatch, capsys, ["--film", str(films), "--captions", "f.jsonl", "--from", str(run),
                                         "--out", str(tmp_path / "ft")])
    assert "error: 1 configuration problem(s):" in err
    exports = ", ".join(str(run / p / "export") for p in (A_JOINT, "a_warmup", PHASE_B))
    assert f"--from '{run}': {exports} trained on {films / 'bikes.mp4'}, {films / 'carphone.mp4'} (--film) in " \
           f"data.root='{tmp_path / 'earlier' / 'pipeline'}'" in err
    assert "leave them out of --film" in err and not (tmp_path / "ft").exists()
    # phase (b) from the official MLLM: --from's b export is not started from
    err = _refusal(monkeypatch, capsys, ["--film", str(films / "bikes.mp4"), "--captions", "f.jsonl", "--from",
                                         str(run), "--out", str(tmp_path / "ft"), "--official-mllm", "m.bin"])
    assert f"{run / A_JOINT / 'export'}, {run / 'a_warmup' / 'export'} trained on {films / 'bikes.mp4'} (--film)" in err
    assert "leave it out of --film" in err


def test_new_footage_passes(tmp_path, films, monkeypatch):
    other = tmp_path / "other.mp4"
    other.write_bytes(b"bikes" * 100 + b"!")  # the size of no trained film
    same_size = tmp_path / "same_size.mp4"
    same_size.write_bytes(b"B" * 500)  # the size of bikes.mp4, other bytes
    run = trained_on(tmp_path, sorted(films.iterdir()))
    for film in (other, same_size):
        recipes = _run(monkeypatch, ["--film", str(film), "--captions", "f.jsonl", "--from", str(run),
                                     "--out", str(tmp_path / "ft")], {})
        finetune.cli()
        assert len(recipes) == 1


def test_a_start_trained_in_the_same_data_folder_holds_out_as_much(tmp_path, films, monkeypatch, capsys):
    out = tmp_path / "ft"
    run = trained_on(tmp_path, sorted(films.iterdir()), val_fraction=0.1, root=out / "pipeline")
    argv = ["--film", str(films), "--captions", "f.jsonl", "--from", str(run), "--out", str(out)]
    err = _refusal(monkeypatch, capsys, argv)
    assert "holding out data.val_fraction=0.1, but the fine-tune holds out data.val_fraction=0.2" in err
    assert "set data.val_fraction=0.1 (or lower)" in err
    recipes = _run(monkeypatch, [*argv, "data.val_fraction=0.1"], {})
    finetune.cli()
    assert len(recipes) == 1


def test_a_short_phase_warms_up_over_a_share_of_its_steps(start, tmp_path):
    """The experiment's warm-up holds for a long fine-tune; a short one warms up over a tenth of its steps, so
    it reaches phase.lr; an override of phase.warmup_steps holds for every phase."""
    from animegamer.recipe import stage_configs

    made = finetune_recipe("f.mp4", "f.jsonl", start, tmp_path / "ft", "tiny", (2, 30, 2000))
    warmups = {cfg.phase.name: cfg.phase.warmup_steps for cfg in stage_configs(made)}
    assert warmups == {"a_joint": 0, "b": 3, "c": 100}
    forced = finetune_recipe("f.mp4", "f.jsonl", start, tmp_path / "ft", "tiny", (2, 30, 2000),
                             extra=("phase.warmup_steps=1",))
    assert {cfg.phase.warmup_steps for cfg in stage_configs(forced)} == {1}
