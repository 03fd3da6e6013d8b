"""The applications' modules (``evaluation``, ``game``, ``ranking``, ``metrics``, ``pages``) import one another
without a cycle, function-local imports included, and the ones ``animegamer --help`` and ``animegamer rank``
load (the ranking page, the evaluation report, the judge) load neither torch nor OpenCV."""
from __future__ import annotations

import subprocess
import sys
from graphlib import CycleError, TopologicalSorter

from test_import_rules import REPO, Edge, import_graph, unit_of

APPLICATIONS = ("evaluation", "game", "ranking", "metrics", "pages")
LIGHT_MODULES = ("animegamer.ranking", "animegamer.evaluation.report", "animegamer.evaluation.judge")
HEAVY_PACKAGES = ("torch", "cv2")


def module_cycle(edges) -> list[str]:
    """One cycle among the modules of ``edges`` (``Edge``: source imports target), or [] when there is none."""
    graph: dict[str, set[str]] = {}
    for edge in edges:
        graph.setdefault(edge.source, set()).add(edge.target)
    try:
        tuple(TopologicalSorter(graph).static_order())
    except CycleError as error:
        return list(error.args[1])
    return []


def test_the_cycle_finder_finds_a_planted_cycle_and_passes_a_chain():
    edge = lambda source, target: Edge("x.py", 1, source, target, local=True)
    assert module_cycle([edge("a", "b"), edge("b", "c"), edge("a", "c")]) == []
    assert set(module_cycle([edge("a", "b"), edge("b", "c"), edge("c", "a")])) == {"a", "b", "c"}


def test_the_application_modules_import_one_another_without_a_cycle():
    """A function-local import counts: a cycle it closes is a layering bug the local import only hides."""
    edges = [e for e in import_graph(REPO) if unit_of(e.source) in APPLICATIONS and unit_of(e.target) in APPLICATIONS]
    assert len(edges) > 10  # the graph was read: the evaluation alone imports its report, judge and sweep
    cycle = module_cycle(edges)
    assert not cycle, "an import cycle: " + " -> ".join(cycle)


def test_the_ranking_page_the_report_and_the_judge_load_neither_torch_nor_opencv():
    probe = (f"import sys\nfor name in {LIGHT_MODULES!r}:\n    __import__(name)\n"
             f"print(','.join(p for p in {HEAVY_PACKAGES!r} if p in sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=REPO)
    assert loaded.stdout.strip() == ""
