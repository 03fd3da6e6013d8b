"""Each command composes its own root schema: only the keys it reads, its own experiments, and a key or an
experiment of another command refused naming that command."""
from __future__ import annotations

import json
import re
import sys

import pytest
from omegaconf import OmegaConf

from animegamer.cli import main
from animegamer.config.compose import OverrideError, carried_over, command_help, compose_config, overrides_for
from animegamer.config.schema import COMMANDS, EvalRunConfig, PipelineRunConfig, RankRunConfig, RunConfig
from animegamer.errors import USER_ERROR_EXIT_CODE


@pytest.mark.parametrize("root, schema, keys", [
    ("pipeline", PipelineRunConfig, {"pipeline", "model", "seed", "log_level"}),
    ("evaluate", EvalRunConfig, {"pipeline", "model", "data", "evaluation", "seed", "log_level"}),
    ("train", RunConfig, {"pipeline", "model", "phase", "data", "trainer", "logger", "checkpoint", "output_dir",
                          "resume_with_changes", "lock_wait_seconds", "seed", "log_level"}),
    ("rank", RankRunConfig, {"ranking"}),
])
def test_each_root_holds_only_the_keys_its_command_reads(root, schema, keys):
    composed = compose_config(root)
    assert set(composed.keys()) == keys
    assert type(OmegaConf.to_object(composed)) is schema is COMMANDS[root].schema


PIPELINE_KEYS = "model, seed, log_level, pipeline"


@pytest.mark.parametrize("root, override, message", [
    ("pipeline", "trainer.devices=2", f"trainer.devices=2: animegamer pipeline does not read trainer (its keys: "
                                      f"{PIPELINE_KEYS}); animegamer train reads it: give it there"),
    ("pipeline", "phase=c", f"phase=c: animegamer pipeline does not read phase (its keys: {PIPELINE_KEYS}); "
                            f"animegamer train reads it: give it there"),
    ("pipeline", "+data.root=/d", f"+data.root=/d: animegamer pipeline does not read data (its keys: {PIPELINE_KEYS}); "
                                  f"animegamer train and animegamer eval read it: give it there"),
    ("evaluate", "output_dir=x", "output_dir=x: animegamer eval does not read output_dir (its keys: model, seed, "
                                 "log_level, pipeline, data, evaluation); animegamer train reads it: give it there"),
])
def test_a_key_another_command_reads_is_refused_naming_that_command(root, override, message):
    with pytest.raises(OverrideError) as refused:
        compose_config(root, [override])
    assert str(refused.value) == message


def test_training_refuses_the_evaluations_keys_naming_the_evaluation():
    with pytest.raises(OverrideError, match=r"^evaluation\.games=2: animegamer train does not read evaluation .*; "
                                            r"animegamer eval reads it: give it there$"):
        compose_config("train", ["evaluation.games=2"])


def test_the_command_line_refuses_another_commands_key_with_exit_code_2(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["animegamer"])
    with pytest.raises(SystemExit) as stopped:
        main(["pipeline", "trainer.devices=2"])
    assert stopped.value.code == USER_ERROR_EXIT_CODE
    err = capsys.readouterr().err
    assert err.startswith("error: trainer.devices=2: animegamer pipeline does not read trainer") and "Traceback" not in err


@pytest.mark.parametrize("root, option, owner", [("train", "quickstart", "animegamer pipeline"),
                                                  ("pipeline", "quickstart_eval", "animegamer eval"),
                                                  ("evaluate", "paper_b", "animegamer train")])
def test_an_experiment_of_another_command_is_refused_naming_it(root, option, owner):
    with pytest.raises(OverrideError) as refused:
        compose_config(root, [f"experiment={option}"])
    verb = COMMANDS[root].verb
    assert str(refused.value) == (f"experiment={option}: {option} is not an option of animegamer {verb} but of "
                                  f"{owner}: give it there")


@pytest.mark.parametrize("root, own, others", [("pipeline", {"quickstart", "finetune_film"}, {"quickstart_a"}),
                                                ("evaluate", {"quickstart_eval", "paper_eval"}, {"quickstart"}),
                                                ("train", {"quickstart_a", "paper_b"}, {"quickstart_eval"})])
def test_each_commands_help_lists_its_own_experiments_and_groups(root, own, others):
    listed = dict(line.split(": ", 1) for line in command_help(root).splitlines() if ": " in line and "==" not in line)
    experiments = set(listed["experiment"].split(", "))
    assert own <= experiments and not others & experiments
    assert ("trainer" in listed) is (root == "train") and ("phase" in listed) is (root == "train")


def test_a_search_path_adds_a_folder_of_experiments_after_the_commands_own(tmp_path):
    (tmp_path / "experiment").mkdir()
    (tmp_path / "experiment" / "mine.yaml").write_text("# @package _global_\nseed: 7\nphase: {max_steps: 3}\n")
    assert compose_config("train", ["experiment=mine"], search_path=[tmp_path]).seed == 7
    given = compose_config("train", [f"hydra.searchpath=['file://{tmp_path}']", "experiment=mine"])
    assert (given.seed, given.phase.max_steps) == (7, 3)
    # the command's own experiments stay found beside it
    assert compose_config("train", ["experiment=quickstart_a"], search_path=[tmp_path]).phase.max_steps == 60
    with pytest.raises(OverrideError, match="no option 'mine'"):
        compose_config("train", ["experiment=mine"])


def test_a_recipes_shared_overrides_go_to_the_commands_that_read_them():
    shared = ["model=tiny", "trainer=cpu", "phase.max_steps=3", "source=films", "pipeline.workers=2",
              "evaluation.games=2", "data.val_fraction=0.3", "output_dir=o", "seed=1", "hydra.job.chdir=false"]
    assert overrides_for("pipeline", shared) == ["model=tiny", "source=films", "pipeline.workers=2", "seed=1",
                                                 "hydra.job.chdir=false"]
    assert overrides_for("evaluate", shared) == ["model=tiny", "source=films", "pipeline.workers=2",
                                                 "evaluation.games=2", "data.val_fraction=0.3", "seed=1",
                                                 "hydra.job.chdir=false"]
    assert overrides_for("train", shared) == [o for o in shared if not o.startswith("evaluation.")]


def test_a_shared_override_no_stage_reads_is_refused_with_the_closest_key_of_every_stage():
    roots = ("train", "pipeline", "evaluate")
    # the closest key is the train command's, though the pipeline's stage is composed first
    with pytest.raises(OverrideError) as refused:
        overrides_for("pipeline", ["seed=1", "tranier.devices=2", "sede=1"], roots)
    assert str(refused.value).splitlines() == [
        "tranier.devices=2: no stage reads 'tranier' (the stages run animegamer train, pipeline and eval); "
        "did you mean trainer?",
        "sede=1: no stage reads 'sede' (the stages run animegamer train, pipeline and eval); did you mean seed?"]
    with pytest.raises(OverrideError, match=r"'zzz' .*; their keys: model, seed, log_level, .*, evaluation$"):
        overrides_for("train", ["zzz=1"], roots)


def test_the_evaluation_of_a_trained_config_carries_its_networks_and_data():
    trained = compose_config("train", ["experiment=ablation_a_addition", "data.val_fraction=0.3", "seed=5"])
    evaluated = carried_over("evaluate", trained, ["evaluation.games=3"])
    assert type(OmegaConf.to_object(evaluated)) is EvalRunConfig
    assert (evaluated.model.encoder.fusion, evaluated.model.name) == ("add", "paper")
    assert (evaluated.data.val_fraction, evaluated.seed, evaluated.evaluation.games) == (0.3, 5, 3)


def test_the_configuration_reference_shows_each_commands_keys_and_who_reads_each():
    from test_docs import _hooks

    page = _hooks().render_reference()
    assert ("| `animegamer pipeline` | `pipeline.yaml` | `PipelineRunConfig` | `model.*`, `seed`, `log_level`, "
            "`pipeline.*` |") in page
    assert ("| `animegamer eval` | `evaluate.yaml` | `EvalRunConfig` | `model.*`, `seed`, `log_level`, `pipeline.*`, "
            "`data.*`, `evaluation.*` |") in page
    keys = page[page.index("## Top-level keys"):]
    row = {k: line for line in keys.splitlines() for k in re.findall(r"^\| `([^`]+)` \|", line)}
    assert row["trainer.devices"].split(" | ")[3] == "`train`"
    assert row["evaluation.games"].split(" | ")[3] == "`eval`"
    assert row["data.root"].split(" | ")[3] == "`train`, `eval`"
    assert row["pipeline.clips.qp"].split(" | ")[3] == "`pipeline`, `train`, `eval`"
    assert row["seed"].split(" | ")[3] == "`pipeline`, `train`, `eval`"
    assert "### `experiment` of `animegamer eval` (`eval/experiment/`)" in page


def test_inspect_takes_the_models_overrides_for_its_layout(monkeypatch, capsys, tmp_path):
    game = tmp_path / "game.json"
    game.write_text('{"turns": [{"instruction": "run", "states": {"ML": 1, "SC": 0, "ET": 0, "ST": 0}}, '
                    '{"instruction": "jump", "states": {"ML": 2, "SC": 1, "ET": 0, "ST": 1}}]}')
    monkeypatch.setattr(sys, "argv", ["animegamer"])
    counts = {}
    for overrides in ([], ["model=tiny"], ["model=tiny", "model.encoder.image_tokens=4"]):
        assert main(["inspect", str(game), *overrides]) == 0
        counts[tuple(overrides)] = json.loads(capsys.readouterr().out)["num_query_tokens"]
    # paper sizes by default (30 text + 196 image tokens), the overridden model's N otherwise
    assert list(counts.values()) == [226, 30 + 16, 30 + 4]
    with pytest.raises(SystemExit) as stopped:
        main(["inspect", str(game), "trainer=gpu"])
    assert stopped.value.code == USER_ERROR_EXIT_CODE
    assert capsys.readouterr().err == "error: trainer=gpu: animegamer inspect reads the model's keys only (model=NAME, model.*)\n"
    with pytest.raises(SystemExit) as stopped:
        main(["inspect", str(tmp_path / "missing.json")])
    assert stopped.value.code == USER_ERROR_EXIT_CODE and "missing.json: not a readable JSON game file" in \
        capsys.readouterr().err


def test_rank_takes_its_keys_as_overrides_and_its_options_win(monkeypatch, capsys):
    from animegamer.cli import rank

    given = []
    monkeypatch.setattr(rank.ranking_cli, "main", lambda argv: given.append(list(argv)) or 0)
    monkeypatch.setattr(sys, "argv", ["animegamer"])
    assert main(["rank", "ranking.runs=[/r/a,/r/b]", "ranking.out=/o", "ranking.port=0", "ranking.report_only=true"]) == 0
    assert given[-1] == ["--port", "0", "--request-timeout", "30.0", "--runs", "/r/a", "/r/b", "--out", "/o",
                         "--report-only"]
    assert main(["rank", "ranking.out=/o", "--runs", "/r/c", "/r/d", "--out", "/p"]) == 0
    assert given[-1][-5:] == ["--runs", "/r/c", "/r/d", "--out", "/p"]  # the options after the keys: argparse keeps them
    with pytest.raises(SystemExit) as stopped:
        main(["rank", "ranking.prt=1"])
    assert stopped.value.code == USER_ERROR_EXIT_CODE
    assert "ranking (RankingConfig) has no key 'prt'; did you mean ranking.port?" in capsys.readouterr().err


def test_schemas_are_registered_once_per_store_and_again_in_a_reset_one(monkeypatch):
    from hydra.core.config_store import ConfigStore

    from animegamer.config.schema import register_configs

    store = ConfigStore.instance()
    register_configs()
    stored = []
    monkeypatch.setattr(store, "store", lambda *args, **kwargs: stored.append(kwargs.get("name")))
    register_configs()
    assert stored == []  # already there: nothing converted again
    monkeypatch.setattr(store, "repo", {})
    register_configs()
    assert {"train_schema", "model_schema", "phase_a_schema", "trainer_schema"} <= set(stored)
