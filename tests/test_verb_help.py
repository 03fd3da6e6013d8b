"""``animegamer VERB --help`` for every verb that ``animegamer --help`` lists: its help on stdout, exit code 0,
a usage that names ``animegamer VERB``, nothing written. A wrong option of the verbs that hand their command
line to Hydra (judge, quickstart, ablate) is one message and exit code 2, before anything is written. Each
command runs as a subprocess in an empty folder of its own (start-up, the imports, dominates)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from animegamer.cli import PROG, commands
from animegamer.errors import USER_ERROR_EXIT_CODE

ANIMEGAMER = [sys.executable, "-m", "animegamer"]
# What a verb's help must say beyond its name.
HELP_SAYS = {
    "judge": ["EVAL_FOLDER", "evaluation.judge.url", "url: ''"],
    "quickstart": ["key=value", "outputs/quickstart/", "every stage", "--out FOLDER"],
    "ablate": ["--only", "--steps"],
}


def run(argv: list[str], folder: Path) -> subprocess.CompletedProcess:
    folder.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("HYDRA_FULL_ERROR", "LOCAL_RANK")}
    return subprocess.run(argv, cwd=folder, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("verb", sorted(commands()))
def test_every_verbs_help_exits_0_and_names_the_verb(verb, tmp_path):
    done = run([*ANIMEGAMER, verb, "--help"], tmp_path / "cwd")
    assert done.returncode == 0, (done.returncode, done.stderr[-3000:])
    assert "Traceback" not in done.stdout + done.stderr and "error" not in done.stderr.lower(), done.stderr[-3000:]
    assert list((tmp_path / "cwd").iterdir()) == []
    for expected in HELP_SAYS.get(verb, []):
        assert expected in done.stdout, (expected, done.stdout[:3000])
    assert f"{PROG} {verb}" in done.stdout, done.stdout[:1000]


# name -> (command line, what the one error line says, a path (in the command's folder) that must not exist)
REFUSED = {
    "judge, an option": ([*ANIMEGAMER, "judge", "--url", "http://127.0.0.1:1/v1"],
                         ["animegamer judge: unknown option '--url'", "animegamer judge --help"], None),
    "judge, no folder": ([*ANIMEGAMER, "judge", "evaluation.judge.url=http://127.0.0.1:1/v1"],
                         ["usage: animegamer judge EVAL_FOLDER"], None),
    "quickstart, an option": ([*ANIMEGAMER, "quickstart", "--steps", "3"],
                              ["animegamer quickstart: unknown option '--steps'; it takes --out FOLDER and key=value "
                               "overrides"],
                              "outputs"),
    "ablate, a misspelt option": ([*ANIMEGAMER, "ablate", "--onyl", "addition", "--out", "X"],
                                  ["animegamer ablate: unknown option '--onyl'; did you mean '--only'?"], "X"),
    "ablate, a misspelt variant": ([*ANIMEGAMER, "ablate", "--only", "addtion", "--out", "X"],
                                   ["animegamer ablate: no Table 3 variant 'addtion'; did you mean 'addition'?"], "X"),
    "ablate, a variant without --only": ([*ANIMEGAMER, "ablate", "addition", "--out", "X"],
                                         ["variants go after --only (animegamer ablate --only addition)"], "X"),
    "ablate, as a module": ([sys.executable, "-m", "animegamer.ablations", "--only", "addtion", "--out", "X"],
                            ["python -m animegamer.ablations: no Table 3 variant 'addtion'"], "X"),
}


@pytest.mark.parametrize("name", REFUSED)
def test_a_wrong_option_is_one_message_and_exit_code_2_writing_nothing(name, tmp_path):
    argv, says, absent = REFUSED[name]
    done = run(argv, tmp_path / "cwd")
    assert done.returncode == USER_ERROR_EXIT_CODE, (done.returncode, done.stderr[-3000:])
    assert "Traceback" not in done.stdout + done.stderr and "LexerNoViableAlt" not in done.stderr, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, done.stderr[-3000:]
    for expected in says:
        assert expected in errors[0], (expected, errors[0])
    assert list((tmp_path / "cwd").iterdir()) == [], absent


def test_the_judge_and_ablations_modules_name_themselves_when_run_as_modules(tmp_path):
    judge = run([sys.executable, "-m", "animegamer.evaluation.judge", "--help"], tmp_path / "judge")
    assert judge.returncode == 0 and "usage: python -m animegamer.evaluation.judge EVAL_FOLDER" in judge.stdout
    ablate = run([sys.executable, "-m", "animegamer.ablations", "--help"], tmp_path / "ablate")
    assert ablate.returncode == 0 and "usage: python -m animegamer.ablations" in ablate.stdout


def test_overrides_written_after_the_variants_of_only_are_overrides(monkeypatch, tmp_path):
    from animegamer import ablations

    seen = {}
    monkeypatch.setattr(ablations, "run_table3", lambda out, names, extra, steps: seen.update(
        out=out, names=names, extra=extra, steps=steps))
    ablations.main(["--out", str(tmp_path / "t3"), "--only", "addition", "no_warmup", "model=tiny", "--steps", "2", "3",
                    "logger=none"])
    assert seen == {"out": tmp_path / "t3", "names": ["addition", "no_warmup"], "extra": ["model=tiny", "logger=none"],
                    "steps": (2, 3)}
