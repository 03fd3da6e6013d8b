"""The import rules of docs/architecture.md ('Import rules'), checked on the source text with ``ast``.

Nothing is imported: every module is parsed, and every ``import``/``from ... import`` anywhere in it
(module top, inside functions, under ``if TYPE_CHECKING``), relative ones resolved against the
module's package, plus ``importlib.import_module("...")`` / ``__import__("...")`` with a literal
name, is checked against the rules below. A failure lists every violation as ``file:line``.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src"
PACKAGE = SRC / "animegamer"
PIPELINE = REPO / "data_pipeline"

PHASES = "animegamer.phases"
DATA = "animegamer.data"
PIPELINE_PACKAGE = "data_pipeline"
DYNAMIC_IMPORTERS = ("import_module", "__import__")  # importlib.import_module(name), __import__(name)


@dataclass(frozen=True)
class Rule:
    """Modules under ``paths`` (folders or single files) may not import ``forbidden`` packages."""

    what: str
    paths: tuple[Path, ...]
    forbidden: tuple[str, ...]


RULES = (
    Rule("models, data, mllm, metrics, the game, evaluation and the pipeline import no phase",
         (PACKAGE / "models", PACKAGE / "data", PACKAGE / "mllm", PACKAGE / "metrics", PACKAGE / "game.py", PACKAGE / "game_models.py",
          PACKAGE / "evaluation.py", PIPELINE),
         (PHASES,)),
    Rule("models import no phase, data or pipeline", (PACKAGE / "models",), (PHASES, DATA, PIPELINE_PACKAGE)),
)


@dataclass(frozen=True)
class Violation:
    path: str
    line: int
    imported: str
    forbidden: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: imports {self.imported} (no {self.forbidden})"


def module_name(path: Path) -> str:
    """Dotted name of a source file: ``src/animegamer/models/mllm.py`` -> ``animegamer.models.mllm``."""
    root = SRC if path.is_relative_to(SRC) else REPO
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _package(module: str, is_package: bool) -> list[str]:
    parts = module.split(".")
    return parts if is_package else parts[:-1]


def imported_names(source: str, module: str, is_package: bool = False) -> list[tuple[int, str]]:
    """(line, dotted name) of everything ``source`` imports, relative imports resolved.

    ``from a.b import c`` yields both ``a.b`` and ``a.b.c``: ``c`` may be a submodule (``from
    animegamer import phases``), and a name that is not one cannot match a package prefix anyway."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                package = _package(module, is_package)
                base_parts = package[: len(package) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            found.append((node.lineno, base))
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names if alias.name != "*"]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name in DYNAMIC_IMPORTERS:
                found.append((node.lineno, node.args[0].value))
    return found


def _is_under(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def violations_in(source: str, path: str, module: str, forbidden: tuple[str, ...],
                  is_package: bool = False) -> list[Violation]:
    """Every import of ``source`` that falls under one of the ``forbidden`` packages (one per line
    and package: ``from animegamer.phases import a, b`` is one violation)."""
    seen: dict[tuple[int, str], Violation] = {}
    for line, name in imported_names(source, module, is_package):
        for package in forbidden:
            if _is_under(name, package) and (line, package) not in seen:
                seen[(line, package)] = Violation(path, line, name, package)
    return sorted(seen.values(), key=lambda v: (v.path, v.line))


def source_files(paths: tuple[Path, ...]) -> list[Path]:
    files: list[Path] = []
    for path in paths:
        files += [path] if path.is_file() else sorted(path.rglob("*.py"))
    return files


def rule_violations(rule: Rule) -> list[Violation]:
    found = []
    for path in source_files(rule.paths):
        found += violations_in(path.read_text(), str(path.relative_to(REPO)), module_name(path), rule.forbidden,
                               is_package=path.name == "__init__.py")
    return found


# --------------------------------------------------------------------------- the checker itself
VIOLATING = '''\
from __future__ import annotations
import animegamer.phases.phase_b
from animegamer.phases import common
from animegamer import phases
from ..phases.phase_a import PhaseA
from .. import phases as p
from . import mllm


def build():
    from animegamer.phases.common import step_seed
    import importlib
    return importlib.import_module("animegamer.phases.phase_c"), __import__("animegamer.data.shards")


from animegamer.phasesx import nothing  # another package that only shares the prefix
from animegamer.models.encoder import ActionAwareEncoder
from ..data.split import held_out
'''


def test_the_checker_finds_every_kind_of_import():
    """Absolute, ``from package import module``, relative, function-local and dynamic imports are
    caught with their lines; a package that merely shares the prefix, and allowed imports, are not."""
    found = violations_in(VIOLATING, "snippet.py", "animegamer.models.snippet", (PHASES, DATA))
    assert [(v.line, v.imported) for v in found] == [
        (2, "animegamer.phases.phase_b"),
        (3, "animegamer.phases"),
        (4, "animegamer.phases"),
        (5, "animegamer.phases.phase_a"),
        (6, "animegamer.phases"),
        (11, "animegamer.phases.common"),
        (13, "animegamer.phases.phase_c"),
        (13, "animegamer.data.shards"),
        (18, "animegamer.data.split"),
    ]
    assert str(found[0]) == "snippet.py:2: imports animegamer.phases.phase_b (no animegamer.phases)"


def test_relative_imports_resolve_against_the_package():
    """In a package's ``__init__`` one dot is the package itself; in a module it is the module's package."""
    assert imported_names("from .phase_a import x", "animegamer.phases", is_package=True)[0] == \
        (1, "animegamer.phases.phase_a")
    assert imported_names("from .phase_a import x", "animegamer.models.mllm")[0] == (1, "animegamer.models.phase_a")
    assert imported_names("from ...data_pipeline import y", "animegamer.models.mllm")[0] == (1, "data_pipeline")


def test_every_rule_covers_existing_modules():
    """A moved or renamed folder must not leave a rule checking nothing."""
    for rule in RULES:
        for path in rule.paths:
            assert path.exists(), f"{rule.what}: {path} does not exist"
            assert source_files((path,)), f"{rule.what}: no Python file under {path}"
    assert module_name(PACKAGE / "models" / "__init__.py") == "animegamer.models"
    assert module_name(PIPELINE / "captioners" / "base.py") == "data_pipeline.captioners.base"


# --------------------------------------------------------------------------- the repository
def test_import_rules_hold():
    found = {rule.what: rule_violations(rule) for rule in RULES}
    count = sum(map(len, found.values()))
    report = "".join(f"\n{what}:" + "".join(f"\n  {v}" for v in vs) for what, vs in found.items() if vs)
    assert count == 0, f"{count} import-rule violation(s) (see docs/architecture.md, 'Import rules'):{report}"
