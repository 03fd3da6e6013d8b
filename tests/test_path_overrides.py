"""Paths as override values: the folders the quick start (``--out``), the Table 3 ablations (``--out``) and the
known-answer benchmark (``OUT``) hand their stages reach each stage as they are, whatever the folder's name (a
quote, a comma, brackets, a space, an equals sign, a backslash, ``${``), since each goes through
:func:`animegamer.config.compose.path_override`. Each check composes the stage's config from the overrides
the command builds and reads the folder back; the command lines are refused for another setting before
anything trains, so no stage runs."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from animegamer.config.compose import compose_config, overrides_for, path_override
from animegamer.errors import USER_ERROR_EXIT_CODE, UserError

WEIRD = "Howl's run, [2] =x"
NAMES = [WEIRD, "back\\slash ${x} 'end\\"]  # the second: backslashes before a quote and at the end, and ${
TINY = ["model=tiny", "trainer=cpu", "logger=none"]
ROOTS = ("train", "pipeline", "evaluate")


def _stage(root: str, *overrides: str):
    """The root's config of a stage given ``overrides`` (each root takes those of its own keys)."""
    return compose_config(root, overrides_for(root, list(overrides), ROOTS))


# --------------------------------------------------------------------------- the quick start
@pytest.mark.parametrize("name", NAMES)
def test_the_quick_starts_out_reaches_every_stage_as_it_is(name, tmp_path):
    from animegamer.quickstart import quickstart_recipe
    from animegamer.recipe import OUT_NEW_FOLDER

    out = tmp_path / name
    recipe = quickstart_recipe(["seed=3"], out)
    assert recipe.new_folder == OUT_NEW_FOLDER  # a stage refused a resume names --out, not an output_dir override
    assert _stage("pipeline", *recipe.pipeline, *recipe.extra).pipeline.output == str(out / "pipeline")
    for overrides, phase in ((recipe.phase_a, "a_warmup"), (recipe.phase_a, "a_joint"), (recipe.phase_b, "b"),
                             (recipe.phase_c, "c")):
        cfg = _stage("train", *overrides, f"phase={phase}", *recipe.extra)
        assert (cfg.output_dir, cfg.data.root, cfg.seed) == (str(out / phase), str(out / "pipeline"), 3)
    assert _stage("evaluate", *recipe.evaluation, *recipe.extra).data.root == str(out / "pipeline")


def test_the_quick_start_takes_out_once_with_its_folder():
    from animegamer.quickstart import parse_overrides

    prog = "animegamer quickstart"
    assert parse_overrides(prog, ["--out", WEIRD, "seed=1"]) == (WEIRD, ["seed=1"])
    assert parse_overrides(prog, ["seed=1", f"--out={WEIRD}"]) == (WEIRD, ["seed=1"])
    assert parse_overrides(prog, ["seed=1"]) == (None, ["seed=1"])
    assert parse_overrides(prog, ["--out", WEIRD, "--help"]) is None
    for wrong, says in ((["--out"], "--out takes one folder"), (["--out", "a", "--out", "b"], "--out takes one folder"),
                        (["--steps", "3"], "unknown option '--steps'")):
        with pytest.raises(UserError, match=says):
            parse_overrides(prog, wrong)


def test_a_quick_start_into_any_folder_is_refused_for_its_setting_alone(tmp_path, monkeypatch, capsys):
    """The folder parses; the one refusal is the clip width's, before anything is written."""
    from animegamer.quickstart import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["animegamer quickstart", "--out", str(tmp_path / WEIRD),
                                      "pipeline.clips.width=100"])
    with pytest.raises(SystemExit) as stopped:
        main()
    err = capsys.readouterr().err
    assert stopped.value.code == USER_ERROR_EXIT_CODE and "width must be a multiple of 16" in err, err[-2000:]
    assert "--out" not in err and "Traceback" not in err and not list(tmp_path.iterdir())


# --------------------------------------------------------------------------- the Table 3 ablations
@pytest.mark.parametrize("name", NAMES)
def test_each_ablation_stage_and_its_scoring_read_the_folders_back(name, tmp_path):
    from animegamer.ablations import OWN, Variant

    out = tmp_path / name
    variant = Variant("addition", OWN, out / "addition")
    start = str(out / "addition" / "a_warmup" / "export")
    warmup = compose_config("train", variant.stage("a_warmup", TINY, 1))
    assert (warmup.output_dir, warmup.phase.init_from) == (str(out / "addition" / "a_warmup"), "")
    joint = compose_config("train", variant.stage("a_joint", TINY, 1, init_from=start))
    assert (joint.output_dir, joint.phase.init_from) == (str(out / "addition" / "a_joint"), start)
    scoring = compose_config("evaluate", variant.scoring(TINY)).evaluation
    assert (scoring.reconstruction_export, scoring.out) == (variant.export("a_joint"), str(out / "addition"))


def test_ablate_into_any_folder_is_refused_for_its_data_alone(tmp_path):
    """Every stage's config composes with the folder in it; the one refusal is the missing data, before
    anything is written."""
    from animegamer.ablations import main
    from animegamer.config.validate import ConfigError

    out, missing = tmp_path / WEIRD, tmp_path / "no data"
    with pytest.raises(ConfigError) as refused:
        main(["--out", str(out), "--only", "no_warmup", *TINY, path_override("data.root", missing)])
    problems = refused.value.problems
    assert problems and all(str(missing) in p and "run the pipeline first" in p for p in problems), problems
    assert not out.exists()


# --------------------------------------------------------------------------- the known-answer benchmark
def _known_answer(name: str, tmp_path: Path):
    from benchmarks.known_answer.driver import SIZES, Layout

    layout = Layout(tmp_path / name, 0, vae_from=tmp_path / name / "vae")
    return layout, SIZES["ci"], layout.runs.resolve()


@pytest.mark.parametrize("name", NAMES)
def test_the_known_answer_stages_read_every_folder_back(name, tmp_path):
    from benchmarks.known_answer.driver import (base_overrides, data_overrides, recipe_of, stage_overrides,
                                                vae_overrides)

    layout, size, runs = _known_answer(name, tmp_path)
    base = str(runs / "a_base" / "export")
    folders = [*data_overrides(layout), *vae_overrides(layout, size), *base_overrides({"decoder base": base})]
    train = compose_config("train", [*stage_overrides(layout, size, "a"), *folders])
    assert (train.output_dir, train.data.root) == (str(runs / "a_joint"), str(layout.pipeline.resolve()))
    assert (train.model.encoders.vae.path, train.model.decoder.path) == (str(layout.vae.resolve()), base)
    pipeline = compose_config("pipeline", [*recipe_of(layout, size).pipeline, *overrides_for("pipeline", folders)])
    assert list(pipeline.pipeline.inputs) == [str(layout.films.resolve())]
    assert pipeline.pipeline.caption.path == str(layout.films.resolve())


@pytest.mark.parametrize("name", NAMES)
def test_the_known_answer_renderers_and_ablations_read_every_folder_back(name, tmp_path):
    from benchmarks.known_answer.driver import ablation_stage, renderer_overrides

    layout, size, runs = _known_answer(name, tmp_path)
    exports = [str(runs / phase / "export") for phase in ("b", "c", "a_joint")]
    evaluation = compose_config("evaluate", renderer_overrides(layout, size, "a2_renderer", *exports[:2],
                                                               reconstruction=exports[2])).evaluation
    assert [evaluation.mllm_export, evaluation.renderer_export, evaluation.reconstruction_export] == exports
    assert evaluation.out == str(runs / "eval_a2_renderer")
    folder, start = runs / "ablation_no_motion_scope", str(runs / "ablation_no_motion_scope" / "a_warmup" / "export")
    warmup = compose_config("train", ablation_stage(layout, size, "no_motion_scope", [], "a_warmup"))
    joint = compose_config("train", ablation_stage(layout, size, "no_motion_scope", [], "a_joint", start))
    assert (warmup.output_dir, joint.output_dir, joint.phase.init_from) == (str(folder / "a_warmup"),
                                                                             str(folder / "a_joint"), start)
    assert warmup.model.decoder.motion_scope is joint.model.decoder.motion_scope is False


def test_the_known_answer_search_path_reads_any_folder_back(tmp_path, monkeypatch):
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from benchmarks.known_answer import experiments

    monkeypatch.setattr(experiments, "CONFIGS", Path(tmp_path / WEIRD))
    parsed = OverridesParser.create().parse_override(experiments.search_path(experiments.TRAIN)).value()
    assert parsed == [f"file://{tmp_path / WEIRD / folder}" for folder in ("train", "pipeline")]


def test_a_folder_named_like_an_interpolation_reaches_the_pipelines_workers_as_it_is():
    """The workers rebuild the typed config from a plain dict of resolved values: ``${`` in a folder's name is
    kept, not read as an interpolation."""
    from data_pipeline.process import as_pipeline_config

    odd = "/tmp/run ${phase.name} 'x'"
    rebuilt = as_pipeline_config({"output": odd, "inputs": [odd + "/film.mp4"]})
    assert rebuilt.output == odd and rebuilt.inputs == [odd + "/film.mp4"]


def test_the_train_commands_own_output_dir_keeps_a_folder_named_like_an_interpolation(tmp_path, monkeypatch):
    """The train command sets its output folder back into the config once resolved (a --multirun job's own
    sub-folder): a ``${`` in the folder's name stays text, so every stage writes where it was told."""
    from animegamer.phases import preflight

    monkeypatch.setattr(preflight, "validate_train_run", lambda cfg, machine=False: None)
    for name in NAMES:
        out = tmp_path / name / "a_joint"
        cfg = preflight.prepare_train_run(_stage("train", *TINY, "experiment=quickstart_a",
                                                 path_override("output_dir", out)))
        assert cfg.output_dir == str(out)
