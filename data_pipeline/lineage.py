"""Lineage of the derived folders: what each was made from, and whether it is still current.

Every derived artefact (features, sessions, representations, session and adaptation shards) records
in its manifest ``made_from`` (the content digests of the artefacts it read) and ``fingerprint``
(those digests plus the settings, weights and exports of its step). A step reuses its previous output
only when the fingerprint is unchanged; a step that reads an artefact made from inputs that have
changed since refuses to run, naming the step to re-run.
"""
from __future__ import annotations

import logging
from pathlib import Path

from animegamer.contracts.files import MANIFEST, SESSIONS_FILE
from animegamer.data.storage import ShardSource
from animegamer.media.fingerprint import FINGERPRINT, fingerprint, shards_digest
from animegamer.utils.io import read_json_if_exists
from data_pipeline.fingerprint import reuse_counts

log = logging.getLogger(__name__)

MADE_FROM = "made_from"
# artefact -> its index file under the pipeline output folder
INDEX_FILES = {
    "clips": f"clips/{MANIFEST}",
    "features": f"features/{MANIFEST}",
    "sessions": SESSIONS_FILE,
    "representations": f"representations/{MANIFEST}",
    "session_shards": f"session_shards/{MANIFEST}",
    "adaptation": f"adaptation/{MANIFEST}",
}
# artefact -> the artefacts its step reads
SOURCES = {
    "features": ("clips",),
    "sessions": ("clips",),
    "representations": ("features",),
    "session_shards": ("sessions", "representations"),
    "adaptation": ("session_shards", "features"),
}
# artefact -> the pipeline step that writes it
PRODUCER = {"clips": "finalize", "features": "precompute", "sessions": "sessions", "representations": "representations",
            "session_shards": "session_shards", "adaptation": "adaptation"}


def index(root: str | Path, name: str) -> dict | None:
    return read_json_if_exists(Path(root) / INDEX_FILES[name])


def digest(root: str | Path, name: str) -> str | None:
    """Content identity of an artefact: its shards' hashes, or for sessions the session list."""
    data = index(root, name)
    if data is None:
        return None
    if name == "sessions":
        return fingerprint(data["sessions"])
    return shards_digest(data)


def made_from(root: str | Path, name: str) -> dict[str, str | None]:
    """The current digests of the artefacts that ``name``'s step reads."""
    return {source: digest(root, source) for source in SOURCES[name]}


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


def stale_reason(root: str | Path, name: str) -> str | None:
    """Why ``name`` (or something it was made from, recursively) is missing or out of date, or None."""
    data = index(root, name)
    if data is None:
        return f"{Path(root) / INDEX_FILES[name]} does not exist: run pipeline.steps=[{PRODUCER[name]}] first"
    for source, recorded in data.get(MADE_FROM, {}).items():
        reason = stale_reason(root, source)
        if reason is not None:
            return reason
        if recorded != digest(root, source):
            return (f"{Path(root) / INDEX_FILES[name]} was made from other {source} than the current ones: "
                    f"run pipeline.steps=[{PRODUCER[name]}] again")
    return None


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
