"""The pipeline steps' side of the derived folders' lineage (:mod:`animegamer.data.lineage`: what each was
made from, and whether it is still current).

Every derived artefact records in its manifest ``made_from`` (the content digests of the artefacts it
read) and ``fingerprint`` (those digests plus the settings, weights and exports of its step). A step
reuses its previous output only when the fingerprint is unchanged; a step that reads an artefact made
from inputs that have changed since refuses to run, naming the step to re-run.
"""
from __future__ import annotations

import logging
from pathlib import Path

from animegamer.data.lineage import INDEX_FILES, SOURCES, index, made_from, stale_reason
from animegamer.data.storage import ShardSource
from animegamer.media.fingerprint import FINGERPRINT, fingerprint
from data_pipeline.fingerprint import reuse_counts

log = logging.getLogger(__name__)


def reusable(root: str | Path, name: str, step_fingerprint: str) -> dict | None:
    """The artefact's index when it was made with ``step_fingerprint`` and all its shards are there."""
    data = index(root, name)
    if data is None or data.get(FINGERPRINT) != step_fingerprint:
        return None
    if "shards" in data and not all(Path(shard.path).is_file() for shard in
                                    ShardSource((Path(root) / INDEX_FILES[name]).parent).shards(data)):
        return None
    return data


def shards_problem(root: str | Path, name: str) -> str | None:
    """What is wrong with the shard names in ``name``'s manifest (see ShardSource.shards), or None."""
    data = index(root, name)
    if data is None or "shards" not in data:
        return None
    return ShardSource((Path(root) / INDEX_FILES[name]).parent).shards_problem(data)


def output_path(root: str | Path, name: str) -> Path:
    """What a step reports as its output: the shard folder, or the sessions index file."""
    path = Path(root) / INDEX_FILES[name]
    return path if name == "sessions" else path.parent


class StaleInput(RuntimeError):
    """A step's input is missing or was made from inputs that changed since."""


def step_fingerprint(root: str | Path, name: str, settings: dict) -> tuple[dict, str]:
    """(made_from, fingerprint) of ``name``'s step now: its sources' digests and its settings.
    Raises :class:`StaleInput` when a source is missing or out of date."""
    for source in SOURCES[name]:
        reason = stale_reason(root, source)
        if reason is not None:
            raise StaleInput(f"{name}: {reason}")
    sources = made_from(root, name)
    return sources, fingerprint(sources, settings)


def reused_summary(root: str | Path, name: str, step_fp: str) -> dict | None:
    """The step's summary when its previous output is current (then the step is skipped), else None."""
    data = reusable(root, name, step_fp)
    if data is None:
        return None
    log.info("%s: reused %s (same inputs and settings)", name, output_path(root, name))
    return {"output": str(output_path(root, name)), **data["counts"], "reuse": reuse_counts(1, 0)}


def built_summary(root: str | Path, name: str, counts: dict) -> dict:
    log.info("%s: recomputed %s", name, output_path(root, name))
    return {"output": str(output_path(root, name)), **counts, "reuse": reuse_counts(0, 1)}
