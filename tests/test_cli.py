"""`animegamer VERB`: the verbs are the installed entry points, each listed with its line, each reached."""
from __future__ import annotations

import json
import sys

import pytest

from animegamer.cli import COMMANDS_GROUP, commands, main, summary

VERBS = {"pipeline", "train", "eval", "play", "finetune", "ablate", "judge", "rank", "quickstart", "inspect"}


def test_every_verb_is_an_installed_entry_point_with_a_one_line_summary(capsys):
    verbs = commands()
    assert set(verbs) == VERBS, f"{COMMANDS_GROUP}: {sorted(verbs)}"
    assert main(["--help"]) == 0
    listing = capsys.readouterr().out.split("verbs:\n", 1)[1]
    lines = {line.split()[0]: line for line in listing.splitlines() if line.startswith("  ")}
    assert set(lines) == VERBS
    for name, entry_point in verbs.items():
        words = summary(entry_point)
        assert len(words.split()) >= 3 and "``" not in words and " :" not in words and words in lines[name], (name, words)
    assert summary(verbs["pipeline"]) == "Run the offline data pipeline on films"


def test_an_unknown_verb_is_refused_with_the_closest_one(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["trian"])
    assert stop.value.code == 2
    assert capsys.readouterr().err.startswith("error: animegamer: no verb 'trian'; did you mean 'train'?")


def test_no_verb_prints_the_listing_and_exits_2(capsys):
    assert main([]) == 2
    assert "quickstart" in capsys.readouterr().out


def test_a_verb_gets_its_arguments_as_its_console_script_does(monkeypatch, capsys, tmp_path):
    game = tmp_path / "game.json"
    game.write_text('{"turns": [{"instruction": "run", "states": {"ML": 1, "SC": 0, "ET": 0, "ST": 0}}]}')
    monkeypatch.setattr(sys, "argv", ["animegamer"])
    assert main(["inspect", str(game), "--query-tokens", "3"]) == 0
    described = json.loads(capsys.readouterr().out)
    assert described["num_query_tokens"] == 3 and described["turn_starts"] == [1]


@pytest.mark.parametrize("verb, first, own, others", [
    ("train", "Train one phase: animegamer train", "quickstart_a", ("quickstart", "quickstart_eval")),
    ("eval", "Evaluate a trained game: animegamer eval", "quickstart_eval", ("quickstart", "quickstart_a")),
    ("pipeline", "The clip-and-caption pipeline: animegamer pipeline", "quickstart", ("quickstart_a", "quickstart_eval"))])
def test_a_config_verbs_help_lists_its_groups_and_experiments_and_no_schema(verb, first, own, others, monkeypatch,
                                                                            capsys):
    monkeypatch.setattr(sys, "argv", ["animegamer"])
    assert main([verb, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(first), out[:200]
    groups = dict(line.split(": ", 1) for line in out.split("==\n\n", 1)[1].split("\n\n", 1)[0].splitlines())
    experiments = groups["experiment"].split(", ")
    assert own in experiments and not set(others) & set(experiments)
    assert "_schema" not in out
    assert len(out.splitlines()) < 40


@pytest.mark.parametrize("old, new", [("data=films", "source=films"), ("data=toy", "source=toy")])
def test_the_film_source_group_is_source_and_its_old_name_is_refused_naming_the_new(old, new):
    from animegamer.config.compose import OverrideError, compose_config

    with pytest.raises(OverrideError) as refused:
        compose_config("pipeline", [old])
    assert str(refused.value) == f"{old}: the group data is now named source: {new} (options: films, toy)"
    assert compose_config("pipeline", [new, "pipeline.inputs=[/films]"]).pipeline.toy_film is (new == "source=toy")
    assert compose_config("train", ["data.root=/shards"]).data.root == "/shards"  # data.* keys stay the data's


def test_a_config_verb_refuses_an_unknown_key_before_any_work(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(sys, "argv", ["animegamer"])
    with pytest.raises(SystemExit) as stop:
        main(["train", "phase.max_step=1", f"output_dir={tmp_path / 'run'}"])
    assert stop.value.code == 2
    assert "phase.max_step=1: phase (PhaseAConfig) has no key 'max_step'; did you mean phase.max_steps?" in \
        capsys.readouterr().err
    assert not (tmp_path / "run").exists()
