"""Fingerprints: short hashes of exactly what produced an artefact, and the identity of a shard set.

A pipeline step records the fingerprint of its inputs (the settings it reads, the identity of its input
files, the exports it ran) and reuses an artefact only when that fingerprint is unchanged; a training
run records the digests of the shard sets it reads and refuses to resume over changed data.

An input file's identity is its content (size and sha256), not its path or modification time: a film
copied, moved or mounted elsewhere keeps its staged work. The hash is cached by (path, size,
modification time) in a folder the caller names, so a file is read once.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from animegamer.utils.io import read_json, sha256_file, write_json_atomic

FINGERPRINT_HEX_CHARS = 16
FINGERPRINT = "fingerprint"  # the key under which every staged record and manifest keeps its fingerprint


def fingerprint(*parts: object) -> str:
    """Short sha256 of JSON-serialisable parts (dict keys sorted)."""
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:FINGERPRINT_HEX_CHARS]


def path_key(path: str | Path) -> str:
    """A short, file-name-safe key of a path (staged records about one input file)."""
    return hashlib.sha1(str(path).encode()).hexdigest()[:FINGERPRINT_HEX_CHARS]


def file_identity(path: str | Path, cache_dir: Path) -> dict:
    """A file's identity: its size and the sha256 of its bytes. The hash is cached in ``cache_dir``
    under the file's (resolved path, size, modification time) and recomputed when any of them changed."""
    path = Path(path).resolve()
    stat = path.stat()
    stamp = {"path": str(path), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    cache = cache_dir / f"{path_key(path)}.json"
    cached = read_json(cache) if cache.exists() else {}
    if {key: cached.get(key) for key in stamp} != stamp:
        cached = {**stamp, "sha256": sha256_file(path)}
        write_json_atomic(cache, cached)
    return {"size": stat.st_size, "sha256": cached["sha256"]}


def shards_digest(manifest: dict) -> str:
    """Identity of a shard set's contents: the names and hashes of its shards."""
    return fingerprint([(s["name"], s["sha256"]) for s in manifest["shards"]])
