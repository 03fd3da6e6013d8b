"""Checks and digests that read a data folder against what exports recorded about their data
(:mod:`animegamer.checkpoints.trained_data`): the held-out split an evaluation plays, the clip size it
renders at, and the digest of clips that is the same wherever they were cut."""
from __future__ import annotations

import hashlib
import json
import tarfile
from pathlib import Path

from animegamer.checkpoints.trained_data import (clip_manifest, data_clip_size, lineage, read_object, recut_since,
                                                  trained_clip_size, trained_root)
from animegamer.contracts.files import MANIFEST
from animegamer.contracts.shards import SOURCE
from animegamer.data.storage import ShardSource


def clip_content_sha256(root: str | Path, clips_dir: str) -> str | None:
    """A digest of the clips alone, the same wherever they were cut: every shard member's name and bytes
    in the manifest's order, each clip's metadata without its film's file name (a renamed film gives the
    same clips), and the manifest's motion bins. The same films cut again in another folder give the same
    value; None without a manifest or with a shard missing."""
    folder = Path(root) / clips_dir
    manifest = read_object(folder / MANIFEST)
    if manifest is None:
        return None
    digest = hashlib.sha256(json.dumps(manifest.get("motion_bins"), sort_keys=True).encode())
    for shard in ShardSource(folder).shards(manifest) if manifest.get("shards") else []:  # names checked
        path = Path(shard.path)
        if not path.is_file():
            return None
        with tarfile.open(path) as tar:
            for member in tar:
                data = tar.extractfile(member).read() if member.isfile() else b""
                if member.name.endswith(".json"):
                    meta = {k: v for k, v in json.loads(data).items() if k != SOURCE}
                    data = json.dumps(meta, sort_keys=True).encode()
                digest.update(member.name.encode() + b"\0" + hashlib.sha256(data).digest())
    return digest.hexdigest()


def _source_hashes(root: Path, clips_dir: str) -> set[str] | None:
    manifest = read_object(clip_manifest(root, clips_dir))
    if manifest is None:
        return None
    return {s["sha256"] for s in manifest.get("sources", []) if isinstance(s, dict) and s.get("sha256")}


def split_problems(cfg, exports: list[tuple[str, str]]) -> list[str]:
    """Evaluation plays the shots held out at ``cfg.data.val_fraction`` of ``cfg.data.root``; each export
    (and every export it started from) must have held out at least those shots.

    Same data folder: the evaluation fraction must not exceed the training one (the split is a stable
    hash below the fraction, so a smaller fraction holds out a subset). Another data folder: it must
    share no film (by the sources' sha256) with the evaluated data, since its split is not this one."""
    root, clips, fraction = Path(cfg.data.root), cfg.data.clips, cfg.data.val_fraction
    mine = _source_hashes(root, clips)
    problems: list[str] = []
    for key, folder in exports:
        smallest: tuple[float, str] | None = None  # the smallest fraction this data was trained with, and where
        said: set[Path] = set()  # other data folders already named for this export: its ancestors' once
        for source, config in (lineage(folder) if folder else []):
            data = config.get("data") or {}
            if "root" not in data or "val_fraction" not in data:
                continue
            trained, trained_clips = trained_root(source, config), data.get("clips", clips)
            if trained.resolve() == root.resolve() and trained_clips == clips:
                if smallest is None or data["val_fraction"] < smallest[0]:
                    smallest = (data["val_fraction"], source)
                continue
            theirs = _source_hashes(trained, trained_clips)
            where = f"{key}={folder!r}" + ("" if source == folder else f" (started from {source})")
            if theirs is None or mine is None:
                if source == folder:
                    problems.append(f"{where} was trained on data.root={str(trained)!r}, which cannot be compared "
                                    f"with this evaluation's data.root={str(root)!r} (no clip manifest): evaluate "
                                    f"with data.root={str(trained)!r}")
            elif theirs & mine and trained.resolve() not in said:
                said.add(trained.resolve())
                problems.append(f"{where} was trained on the same film(s) from data.root={str(trained)!r}, whose "
                                f"held-out split is not this one's: evaluate with data.root={str(trained)!r}")
        if smallest is not None and fraction > smallest[0]:
            trained, source = smallest
            where = f"{key}={folder!r}" + ("" if source == folder else f" (started from {source})")
            problems.append(f"{where} was trained with data.val_fraction={trained}, but this evaluation holds out "
                            f"data.val_fraction={fraction}: it would play shots the model trained on; set "
                            f"data.val_fraction={trained} (or lower)")
    return problems




def clip_size_problems(cfg, exports: list[tuple[str, str]]) -> list[str]:
    """Exports evaluated on ``cfg.data.root`` must have been trained at its clips' size."""
    data = data_clip_size(cfg.data.root, cfg.data.clips)
    problems = []
    for key, folder in exports:
        trained = trained_clip_size(folder) if folder else None
        if data is not None and trained is not None and trained != data:
            recut = " (the folder was cut again since that export trained on it)" if recut_since(
                folder, cfg.data.root, cfg.data.clips) else ""
            problems.append(f"{key}={folder!r} was trained on clips of {trained}, but the clips in "
                            f"{Path(cfg.data.root) / cfg.data.clips} are {data}{recut}: evaluate on a pipeline "
                            f"output cut at the trained size")
    return problems
