"""The bottom layers of the library (docs/architecture.md) import only their own layer or lower ones, function-local
imports included, and never the offline pipeline: the pipeline builds on them, not the other way round."""
from __future__ import annotations

import pytest
from test_import_rules import LAYERS as ALL_LAYERS
from test_import_rules import PACKAGE, PIPELINE_PACKAGE, Rule, rule_violations

# The bottom six layers of the one layer table (test_import_rules.LAYERS), each as its library units: the
# package's own __init__ and the pipeline (which sits beside data) are not files of a layer here.
BOTTOM = 6
LAYERS = tuple(tuple(unit for unit in layer if unit not in ("", PIPELINE_PACKAGE)) for layer in ALL_LAYERS[:BOTTOM])


def _top_level_names() -> set[str]:
    """Every package and module directly under src/animegamer (apps and recipes included)."""
    return {p.stem for p in PACKAGE.iterdir() if p.suffix == ".py" and p.stem != "__init__"} | {
        p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}


def _rule(level: int) -> Rule:
    allowed = {name for layer in LAYERS[: level + 1] for name in layer}
    forbidden = tuple(sorted(f"animegamer.{name}" for name in _top_level_names() - allowed)) + (PIPELINE_PACKAGE,)
    paths = []
    for name in LAYERS[level]:
        path = PACKAGE / name if (PACKAGE / name).is_dir() else PACKAGE / f"{name}.py"
        files = sorted(path.rglob("*.py")) if path.is_dir() else [path]
        paths += files
    return Rule(f"{', '.join(LAYERS[level])} import nothing above them", tuple(paths), forbidden)


@pytest.mark.parametrize("level", range(len(LAYERS)), ids=["+".join(layer) for layer in LAYERS])
def test_a_bottom_layer_imports_nothing_above_it(level):
    rule = _rule(level)
    assert rule.paths and "animegamer.phases" in rule.forbidden and PIPELINE_PACKAGE in rule.forbidden
    found = rule_violations(rule)
    assert not found, f"{rule.what}:\n" + "\n".join(map(str, found))


def test_metrics_and_training_never_import_the_pipeline():
    paths = tuple(f for f in sorted((PACKAGE / "metrics").rglob("*.py")) + sorted((PACKAGE / "training").rglob("*.py")))
    found = rule_violations(Rule("metrics and training import no pipeline", paths, (PIPELINE_PACKAGE,)))
    assert len(paths) > 10 and not found, "\n".join(map(str, found))
