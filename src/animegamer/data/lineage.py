"""Lineage of the pipeline's derived folders under its output folder: what each was made from, and whether it
is still current. Every derived artefact (features, sessions, representations, session and adaptation
shards) records in its manifest ``made_from``, the content digests of the artefacts its step read; an
artefact is current when every one of them, recursively, still has the digest recorded. The pipeline's
steps refuse to read a stale folder (``data_pipeline/lineage.py``), and so does a training run its samples.
"""
from __future__ import annotations

from pathlib import Path

from animegamer.contracts.files import MANIFEST, SESSIONS_FILE
from animegamer.media.fingerprint import fingerprint, shards_digest
from animegamer.utils.io import read_json_if_exists

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


def artefact_at(root: str | Path, folder: str | Path) -> str | None:
    """The derived artefact (a key of :data:`INDEX_FILES`) whose manifest lives in ``folder`` under the
    pipeline output ``root``; None for a folder outside that layout (its lineage is not known)."""
    manifest = (Path(folder) / MANIFEST).resolve()
    return next((name for name, file in INDEX_FILES.items() if (Path(root) / file).resolve() == manifest), None)


def stale_folder_problems(root: str | Path, folder: str | Path) -> list[str]:
    """A shard folder a run reads (``data.root``'s ``folder``) made from folders the pipeline has remade since
    (other clips, sessions or representations): read beside the current ones, its samples would not match
    the held-out split or the clips. One problem naming the step to run again; none for a folder outside
    the pipeline's layout."""
    artefact = artefact_at(root, folder)
    reason = None if artefact is None else stale_reason(root, artefact)
    return [] if reason is None else [f"data.root={str(root)!r}: {reason}"]
