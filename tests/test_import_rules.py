"""The import rules of docs/architecture.md ('Import rules'), checked on the source text with ``ast``.

Nothing is imported: every module of ``animegamer`` and ``data_pipeline`` is parsed, and every
``import``/``from ... import`` anywhere in it (module top, inside functions, under ``if TYPE_CHECKING``),
relative ones resolved against the module's package, plus ``importlib.import_module("...")`` /
``__import__("...")`` with a literal name, and a command's body named with ``command_body("module", "name")``
(``animegamer.config.compose``: imported when the command calls it, after its override check), becomes an
edge of the import graph. The graph is checked against the layer table below (:data:`LAYERS`, the one
copy of docs/architecture.md's): no import goes up a layer, no cycle joins two units, ``animegamer`` never
imports ``data_pipeline``, and a project module is imported inside a function only where
:data:`LOCAL_IMPORTS` says why. A failure lists every violation as ``file:line``.
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
# A command's body, named at its module's top and imported once the command line passed: an import like any other
# for the layers, and one inside a function when named there.
NAMED_IMPORTERS = (*DYNAMIC_IMPORTERS, "command_body")


@dataclass(frozen=True)
class Rule:
    """Modules under ``paths`` (folders or single files) may not import ``forbidden`` packages."""

    what: str
    paths: tuple[Path, ...]
    forbidden: tuple[str, ...]




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
    return [(node.lineno, name) for node in ast.walk(ast.parse(source)) for name in names_of(node, module, is_package)]


def names_of(node: ast.AST, module: str, is_package: bool = False) -> list[str]:
    """The dotted names one statement or call imports (none for anything else)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        if node.level:
            package = _package(module, is_package)
            base_parts = package[: len(package) - (node.level - 1)]
            base = ".".join(base_parts + ([node.module] if node.module else []))
        else:
            base = node.module or ""
        return [base] + [f"{base}.{alias.name}" for alias in node.names if alias.name != "*"]
    if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
            and isinstance(node.args[0].value, str):
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if name in NAMED_IMPORTERS:
            return [node.args[0].value]
    return []


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


# --------------------------------------------------------------------------- the statement checker
# ``violations_in`` reads one file's statements against forbidden packages (test_bottom_layers builds its rules on
# it); the graph below reads the same statements through ``names_of``.
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


def test_every_layer_names_existing_modules():
    """A moved or renamed folder must not leave a layer entry that checks nothing."""
    units = {unit_of(m) for m in project_modules(REPO)}
    assert not set(LAYER_OF) - units, f"layer entries with no module: {sorted(set(LAYER_OF) - units)}"
    assert module_name(PACKAGE / "models" / "__init__.py") == "animegamer.models"
    assert module_name(PIPELINE / "captioners" / "base.py") == "data_pipeline.captioners.base"


# --------------------------------------------------------------------------- the layers
# docs/architecture.md's layer table, bottom to top: a unit (``animegamer.<name>``) imports its own
# layer or lower ones. The pipeline sits beside ``data`` (it builds on the library up to the data
# readers; the library reaches it only through animegamer.pipeline_port and its entry point).
LAYERS = (
    ("utils", "errors", ""),  # "": the package's own __init__ (its docstring and version), which every import runs
    ("config",),
    ("contracts", "media", "checkpoints"),
    ("diffusion", "mllm"),
    ("models",),
    ("data", PIPELINE_PACKAGE),
    ("metrics", "training"),
    ("phases",),
    ("game", "evaluation", "pages", "ranking", "pipeline_port"),
    ("recipe", "finetune", "finetune_checks", "ablations", "quickstart", "toy_vae"),
    ("cli", "__main__"),
)
# Project modules a function may import (each import of one is otherwise at the module's top), and why.
LOCAL_IMPORTS: dict[tuple[str, str], str] = {}


def unit_of(module: str) -> str:
    """``animegamer.models.mllm`` -> ``models``; ``data_pipeline.x`` -> ``data_pipeline``; ``animegamer`` -> ``""``."""
    parts = module.split(".")
    if parts[0] == PIPELINE_PACKAGE:
        return PIPELINE_PACKAGE
    return parts[1] if len(parts) > 1 else ""


LAYER_OF = {unit: level for level, units in enumerate(LAYERS) for unit in units}


@dataclass(frozen=True)
class Edge:
    path: str  # the importing file, relative to the tree's root
    line: int
    source: str  # importing module
    target: str  # imported project module
    local: bool  # inside a function (not under TYPE_CHECKING at module level)

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.source} imports {self.target}{' in a function' if self.local else ''}"


def _imports_with_context(tree: ast.AST):
    """(node, inside a function) for every import statement and literal dynamic import."""
    def visit(node, in_function):
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, (ast.Import, ast.ImportFrom, ast.Call)):
                yield child, in_function
            yield from visit(child, inner)
    yield from visit(tree, False)


def project_modules(root: Path) -> dict[str, Path]:
    """Every module of ``animegamer`` (under ``root/src``) and ``data_pipeline`` (under ``root``)."""
    found = {}
    for base, package in ((root / "src", "animegamer"), (root, PIPELINE_PACKAGE)):
        for path in sorted((base / package).rglob("*.py")):
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def import_graph(root: Path) -> list[Edge]:
    """Every import of a project module by a project module under ``root``."""
    modules = project_modules(root)
    edges = []
    for module, path in modules.items():
        is_package = path.name == "__init__.py"
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node, local in _imports_with_context(tree):
            names = names_of(node, module, is_package)
            if isinstance(node, ast.ImportFrom):  # the package itself only where a name is not a submodule of it
                submodules = {n for n in names[1:] if n in modules}
                names = sorted(submodules) + ([names[0]] if len(submodules) < len(names) - 1 else [])
            targets = {next((c for c in (n, n.rsplit(".", 1)[0]) if c in modules), None) for n in names}
            for target in sorted(t for t in targets if t and t != module):
                edges.append(Edge(str(path.relative_to(root)), node.lineno, module, target, local))
    return edges


def _reach(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in graph.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def graph_problems(root: Path) -> list[str]:
    """Every breach of the import rules in the tree at ``root``, one line each."""
    edges = import_graph(root)
    problems = []
    for e in edges:
        src, dst = unit_of(e.source), unit_of(e.target)
        if src not in LAYER_OF or dst not in LAYER_OF:
            problems.append(f"{e}: unit {(src if src not in LAYER_OF else dst)!r} is in no layer of LAYERS")
        elif e.source.startswith("animegamer") and dst == PIPELINE_PACKAGE:
            problems.append(f"{e}: the library never imports the pipeline (reach it through animegamer.pipeline_port)")
        elif src != dst and LAYER_OF[dst] > LAYER_OF[src]:
            problems.append(f"{e}: up from layer {LAYER_OF[src]} ({src}) to layer {LAYER_OF[dst]} ({dst})")
        if e.local and (e.source, e.target) not in LOCAL_IMPORTS:
            problems.append(f"{e}: a project module is imported at the module's top (or listed in LOCAL_IMPORTS "
                            f"with its reason)")
    units: dict[str, set[str]] = {}
    for e in edges:
        if unit_of(e.source) != unit_of(e.target):
            units.setdefault(unit_of(e.source), set()).add(unit_of(e.target))
    reach = {u: _reach(units, u) for u in units}
    for e in edges:
        src, dst = unit_of(e.source), unit_of(e.target)
        if src != dst and src in reach.get(dst, ()):
            problems.append(f"{e}: a cycle between units {src} and {dst} ({dst} reaches {src} again)")
    return problems


# --------------------------------------------------------------------------- the checker itself
def _tree(root: Path, files: dict[str, str]) -> Path:
    """A synthetic source tree: ``src/animegamer/...`` and ``data_pipeline/...`` files under ``root``."""
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        for parent in path.relative_to(root).parents:
            if parent.name and parent.name != "src":
                (root / parent / "__init__.py").touch()
    return root


CLEAN = {
    "src/animegamer/contracts/files.py": "MANIFEST = 'manifest.json'\n",
    "src/animegamer/media/video.py": "from animegamer.contracts.files import MANIFEST\n",
    "src/animegamer/data/shards.py": "from animegamer.media.video import MANIFEST\n",
    "data_pipeline/run.py": "from animegamer.data.shards import MANIFEST\n",
}


def test_the_checker_passes_a_tree_that_keeps_the_rules(tmp_path):
    assert graph_problems(_tree(tmp_path, CLEAN)) == []
    assert len(import_graph(tmp_path)) == 3


def test_the_checker_finds_a_planted_cycle_between_units_of_one_layer(tmp_path):
    """contracts and media share a layer: each may import the other, but not both."""
    root = _tree(tmp_path, {**CLEAN, "src/animegamer/contracts/names.py": "import animegamer.media.video as v\n"})
    problems = graph_problems(root)
    assert [p.split(": ", 1)[0] for p in problems] == ["src/animegamer/contracts/names.py:1",
                                                      "src/animegamer/media/video.py:1"]
    assert all("a cycle between units" in p for p in problems)


def test_the_checker_finds_a_planted_function_local_pipeline_import(tmp_path):
    """Inside a function, relative to the package or by importlib with a literal name: each is found."""
    planted = ("import importlib\n\n\ndef later():\n    from data_pipeline.run import MANIFEST\n"
               "    return importlib.import_module('data_pipeline.run')\n")
    root = _tree(tmp_path, {**CLEAN, "src/animegamer/models/steps.py": planted})
    problems = graph_problems(root)
    assert sum("the library never imports the pipeline" in p for p in problems) == 2
    assert sum("imported at the module's top" in p for p in problems) == 2
    assert {p.split(": ", 1)[0] for p in problems} == {"src/animegamer/models/steps.py:5",
                                                      "src/animegamer/models/steps.py:6"}


def test_the_checker_reads_a_named_command_body_as_an_import(tmp_path):
    """``command_body("module", "name")`` at a command's top is an import kept to the layers: allowed from the
    cli down to phases, refused up a layer, and inside a function only where LOCAL_IMPORTS says why."""
    body = "from animegamer.config.compose import command_body\n\nrun = command_body('animegamer.phases.run', 'run')\n"
    files = {**CLEAN, "src/animegamer/phases/run.py": "STEPS = 1\n", "src/animegamer/config/compose.py": "X = 1\n"}
    root = _tree(tmp_path / "kept", {**files, "src/animegamer/cli/train.py": body})
    assert graph_problems(root) == []
    assert any(e.source == "animegamer.cli.train" and e.target == "animegamer.phases.run" and not e.local
               for e in import_graph(root))
    up = body.replace("animegamer.phases.run", "animegamer.cli.train")
    local = ("from animegamer.config.compose import command_body\n\n\ndef later():\n"
             "    return command_body('animegamer.contracts.files', 'MANIFEST')\n")
    root = _tree(tmp_path / "broken", {**files, "src/animegamer/cli/train.py": body,
                                       "src/animegamer/models/steps.py": up, "src/animegamer/data/later.py": local})
    assert graph_problems(root) == [
        "src/animegamer/data/later.py:5: animegamer.data.later imports animegamer.contracts.files in a function: a "
        "project module is imported at the module's top (or listed in LOCAL_IMPORTS with its reason)",
        "src/animegamer/models/steps.py:3: animegamer.models.steps imports animegamer.cli.train: up from layer 4 "
        "(models) to layer 10 (cli)"]


def test_the_checker_finds_an_import_up_a_layer_even_under_type_checking(tmp_path):
    planted = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..data.shards import MANIFEST\n")
    root = _tree(tmp_path, {**CLEAN, "src/animegamer/diffusion/frames.py": planted})
    assert graph_problems(root) == ["src/animegamer/diffusion/frames.py:3: animegamer.diffusion.frames imports "
                                    "animegamer.data.shards: up from layer 3 (diffusion) to layer 5 (data)"]


def test_every_unit_of_the_repository_has_a_layer():
    units = {unit_of(m) for m in project_modules(REPO)}
    assert not units - set(LAYER_OF), f"units in no layer: {sorted(units - set(LAYER_OF))}"
    assert {"contracts", "evaluation", "pipeline_port", PIPELINE_PACKAGE} <= units


# --------------------------------------------------------------------------- the repository
def test_the_repository_keeps_the_import_rules():
    """No breach anywhere: every import of the library and the pipeline keeps the layer table."""
    problems = graph_problems(REPO)
    named = {(e.source, e.target) for e in import_graph(REPO)}
    assert ("animegamer.cli.train", "animegamer.phases.run") in named  # the named bodies were read as imports
    assert ("animegamer.cli.evaluate", "animegamer.evaluation.reuse") in named
    assert not problems, f"{len(problems)} import-rule breach(es) (docs/architecture.md, 'Import rules'):\n" + \
        "\n".join(problems)


def test_the_architecture_page_shows_this_layer_table():
    """docs/architecture.md's 'Import rules' table names the units of LAYERS, layer by layer (its prose aside)."""
    import re

    page = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| (\d+) \| (.+) \|$", page.split("## Import rules", 1)[1], flags=re.MULTILINE)
    # "the package's own `__init__`" is the unit "" of LAYERS
    documented = [{"" if unit == "__init__" else unit for unit in re.findall(r"`([\w.]+)`", units)} - {PIPELINE_PACKAGE}
                  for _, units in rows]
    assert [int(level) for level, _ in rows] == list(range(len(LAYERS)))
    assert documented == [set(units) - {PIPELINE_PACKAGE} for units in LAYERS]
    assert "`data_pipeline`" in rows[LAYER_OF[PIPELINE_PACKAGE]][1]
