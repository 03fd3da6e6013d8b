"""The test tiers (tests/tiers.py, applied in conftest.py): the default run leaves the slow tier out, CI's
command runs it, and every entry of the slow list names a test that exists."""
from __future__ import annotations

import ast
import subprocess
import sys

from conftest import REPO
from tiers import SLOW, SLOW_FIXTURES, is_slow

TESTS = REPO / "tests"
CI_TIERS = ["-m", "slow or not slow"]  # .ci/run's selection: every tier
# A listed test in a module whose import is cheap, beside fast tests.
LISTED = "test_cli_errors.py::test_a_wrong_key_option_or_value_is_one_message_and_exit_code_2_writing_nothing"


def _collected(*args: str, file: str = LISTED.partition("::")[0]) -> list[str]:
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           f"tests/{file}", *args],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode in (0, 5), done.stdout + done.stderr  # 5: every test deselected
    return [line for line in done.stdout.splitlines() if "::" in line]


def test_the_default_run_leaves_the_slow_tier_out_and_ci_runs_it():
    default, everything, slow = _collected(), _collected(*CI_TIERS), _collected("-m", "slow")
    assert len(default) >= 1 and any(line.startswith(f"tests/{LISTED}") for line in slow), everything
    assert slow == [line for line in everything if is_slow(line)] and sorted(default + slow) == sorted(everything)


def test_a_listed_test_is_slow_with_every_parametrisation_and_its_neighbours_are_not():
    assert is_slow(f"tests/{LISTED}") and is_slow(f"tests/{LISTED}[train]")
    assert not is_slow(f"tests/{LISTED}_too") and not is_slow("tests/test_cli_errors.py::test_other")
    assert not is_slow(f"tests/other_{LISTED}")


def _tests_in(path) -> set[str]:
    """``test`` and ``Class::test`` names defined in the test file ``path``."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            names |= {f"{node.name}::{f.name}" for f in node.body
                      if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and f.name.startswith("test")}
    return names


def test_every_slow_entry_names_an_existing_test():
    stale = []
    for entry in sorted(SLOW):
        file, _, name = entry.partition("::")
        path = TESTS / file
        if not path.is_file() or (name and name not in _tests_in(path)):
            stale.append(entry)
    assert stale == [], f"tests/tiers.py names tests that do not exist: {stale}"


def _uses(node: ast.FunctionDef, fixtures) -> bool:
    return any(arg.arg in fixtures for arg in node.args.args)


def test_a_test_using_a_slow_fixture_is_slow_without_an_entry():
    """The quick start's game is built by the first test that needs it: in the default run none may."""
    file = "test_trained_data.py"  # three tests use the quick start, none of them listed
    tests = [node for node in ast.parse((TESTS / file).read_text()).body if isinstance(node, ast.FunctionDef)
             and node.name.startswith("test")]
    users = {node.name for node in tests if _uses(node, SLOW_FIXTURES)}
    assert len(users) == 3 and not {f"{file}::{name}" for name in users} & SLOW
    default = {line.partition("::")[2] for line in _collected(file=file)}
    assert default == {node.name for node in tests} - users
    assert is_slow(f"tests/{file}::test_x", ["tmp_path", *SLOW_FIXTURES]) and not is_slow(f"tests/{file}::test_x")


def test_the_longest_files_are_handed_out_first_and_each_exists():
    from tiers import LONGEST_FIRST, schedule_rank

    assert all((TESTS / name).is_file() for name in LONGEST_FIRST) and len(set(LONGEST_FIRST)) == len(LONGEST_FIRST)
    ids = ["tests/test_zz_other.py::t", f"tests/{LONGEST_FIRST[1]}::t", f"tests/{LONGEST_FIRST[0]}::t[x]"]
    assert sorted(ids, key=schedule_rank) == [ids[2], ids[1], ids[0]]
