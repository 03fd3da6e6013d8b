"""How the library reaches the data pipeline without importing it.

The recipes (quick start, fine-tuning, the Table 3 recipe, the ablations) run pipeline steps between
their training stages and refuse a run before its first stage with the pipeline's problems among the
rest. They ask for a :class:`Pipeline` through :func:`load_pipeline`, which reads the installed entry
point ``animegamer.pipeline`` (``default``: ``data_pipeline.plugin:PIPELINE`` of this project's
setup.cfg); the pipeline imports the library, never the other way round.
"""
from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any, Protocol, Sequence

from animegamer.errors import UserError

ENTRY_POINT_GROUP = "animegamer.pipeline"
DEFAULT = "default"


class Pipeline(Protocol):
    """What the recipes ask of the data pipeline; each config is a composed ``pipeline`` config."""

    def check(self, cfg: Any, problems: Sequence[str] = ()) -> None:
        """Raise :class:`~animegamer.config.validate.ConfigError` listing every problem of ``cfg`` and
        ``problems`` (those a recipe found in its other stages); return when there are none."""

    def steps(self, cfg: Any) -> list[str]:
        """The steps ``cfg`` runs, in order: those asked for that have what they need."""

    def run(self, overrides: list[str]) -> dict:
        """Run the pipeline as ``python -m data_pipeline <overrides>`` does; its report."""

    def inputs(self, cfg: Any) -> list:
        """The film files ``cfg``'s ``pipeline.inputs`` name, as the pipeline's ingest finds them (paths)."""


def load_pipeline(name: str = DEFAULT) -> Pipeline:
    """The pipeline installed under ``name`` in the ``animegamer.pipeline`` entry-point group."""
    found = entry_points(group=ENTRY_POINT_GROUP, name=name)
    if not found:
        raise UserError(f"no data pipeline is installed as entry point {ENTRY_POINT_GROUP}:{name}: install this "
                        f"project with its pipeline (pip install -e . from the repository)")
    return next(iter(found)).load()
