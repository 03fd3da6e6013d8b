"""metrics.json is read back through one reader (``animegamer.evaluation.report.read_evaluation``): the
judge rerun and the ranking refuse the same damaged records with the same words, naming the file."""
from __future__ import annotations

import json

import pytest

from animegamer.errors import InvalidInputError, MissingInputError
from animegamer.evaluation.judge import judge_folder
from animegamer.evaluation.report import read_evaluation
from animegamer.ranking.runs import load_run

DAMAGED = {
    "a list": [],
    "a game that is not an object": {"metrics": {}, "games": [1]},
    "metrics that are not an object": {"metrics": [], "games": [{"id": "g0", "turns": []}]},
    "games that are not a list": {"metrics": {}, "games": {"id": "g0"}},
}


def _readers(folder):
    return {"judge": lambda: judge_folder(folder, None), "ranking": lambda: load_run(folder, "run")}


@pytest.mark.parametrize("damage", sorted(DAMAGED))
def test_a_damaged_record_is_refused_by_every_reader_naming_the_file(tmp_path, damage):
    (tmp_path / "metrics.json").write_text(json.dumps(DAMAGED[damage]))
    for reader, read in _readers(tmp_path).items():
        with pytest.raises(InvalidInputError) as refused:
            read()
        assert str(refused.value).startswith(f"{tmp_path / 'metrics.json'}: not an evaluation record"), reader


def test_a_missing_record_names_the_file_and_what_the_reader_wanted(tmp_path):
    for reader, read in _readers(tmp_path).items():
        with pytest.raises(MissingInputError, match="metrics.json: missing; .*evaluate.py"):
            read()
    with pytest.raises(MissingInputError) as refused:
        read_evaluation(tmp_path, "the folder named here")
    assert str(refused.value) == f"{tmp_path / 'metrics.json'}: missing; the folder named here"


def test_a_required_key_is_named_and_a_good_record_comes_back_whole(tmp_path):
    record = {"metrics": {"acc_f": 0.5}, "games": [{"id": "g0", "turns": []}], "paper": {"acc_f": 0.67}}
    (tmp_path / "metrics.json").write_text(json.dumps({"games": []}))
    with pytest.raises(InvalidInputError, match=r"not an evaluation record \(KeyError: 'metrics'\)"):
        read_evaluation(tmp_path, "", ("metrics",))
    (tmp_path / "metrics.json").write_text(json.dumps(record))
    assert read_evaluation(tmp_path, "", ("metrics", "games")) == record
    assert load_run(tmp_path, "run").games == {"g0": record["games"][0]}
