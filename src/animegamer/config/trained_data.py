"""What an export says about the data it was trained on: its ``export.json`` holds the resolved config
and, written with the export (:func:`trained_data_record`), the data folder as an absolute path, the
clip size its clip manifest recorded and that manifest's sha256. Evaluation, the game and fine-tuning
read them so that they never score shots a model trained on and never render or cut clips at a size
the renderer was not trained at, even after the data folder was cut again at another size or the
command runs from another directory. Exports written before the record existed fall back to the
config's ``data.root`` and the clip manifest found there now.

An export started from another (``phase.init_from``) learned from that one's data too, so the split
check follows the chain of exports back to the first.
"""
from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from animegamer.config.schema import TrainDataConfig
from animegamer.data.layout import MANIFEST
from animegamer.utils.io import read_json_if_exists, sha256_file

log = logging.getLogger(__name__)

CLIP_SIZE_KEYS = ("frames", "height", "width", "fps")
TRAINED_DATA_KEY = "trained_data"  # export.json's record of the data the run trained on
DEFAULT_CLIPS_DIR = TrainDataConfig.clips


def clip_manifest(root: str | Path, clips_dir: str) -> Path:
    """The manifest of a pipeline output's clip shards."""
    return Path(root) / clips_dir / MANIFEST


def clip_manifest_sha256(root: str | Path, clips_dir: str) -> str | None:
    """The digest of a pipeline output's clip manifest; None where there is none."""
    manifest = clip_manifest(root, clips_dir)
    return sha256_file(manifest) if manifest.is_file() else None


# The per-clip metadata field that names the source film's path: where the clips were cut, not what they are.
CLIP_SOURCE_KEY = "source"


def clip_content_sha256(root: str | Path, clips_dir: str) -> str | None:
    """A digest of the clips alone, the same wherever they were cut: every shard member's name and bytes
    in the manifest's order, each clip's metadata without its source film's path (shards are otherwise
    byte-identical when their contents are), and the manifest's motion bins. The same films cut again in
    another folder give the same value; None without a manifest or with a shard missing."""
    import hashlib
    import json
    import tarfile

    from animegamer.data.storage import ShardSource

    folder = Path(root) / clips_dir
    manifest = _read(folder / MANIFEST)
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
                    meta = {k: v for k, v in json.loads(data).items() if k != CLIP_SOURCE_KEY}
                    data = json.dumps(meta, sort_keys=True).encode()
                digest.update(member.name.encode() + b"\0" + hashlib.sha256(data).digest())
    return digest.hexdigest()


def _read(path: Path) -> dict | None:
    """The JSON object at ``path``; None where there is no such file."""
    data = read_json_if_exists(path)
    return data if isinstance(data, dict) else None


def _export_json(folder: str | Path) -> dict:
    from animegamer.checkpoints.export import EXPORT_FILE

    return _read(Path(folder) / EXPORT_FILE) or {}


def export_config(folder: str | Path) -> dict | None:
    """The resolved config recorded in an export folder's ``export.json`` (None if it has none)."""
    config = _export_json(folder).get("config")
    return config if isinstance(config, dict) else None


def trained_preset(export: str | Path) -> str | None:
    """The model preset ``export`` was trained with (its recorded config), None when it records none."""
    name = ((export_config(export) or {}).get("model") or {}).get("name")
    return str(name) if name else None


def preset_overrides(overrides: list[str], exports: list[str]) -> list[str]:
    """``overrides`` with ``model=<the preset the first of exports was trained with>`` in front, unless
    they name a preset themselves: a command given exports plays them with the networks they fit."""
    if any(o.split("=", 1)[0].lstrip("+~") == "model" for o in overrides):
        return overrides
    preset = next((p for p in map(trained_preset, filter(None, exports)) if p), None)
    return [f"model={preset}", *overrides] if preset else overrides


def trained_data_record(config: dict) -> dict | None:
    """What a run with the resolved ``config`` trains on, for its ``export.json``: the data folder (absolute,
    resolved from the training's directory), its clip folder, their clip size and the clip manifest's
    sha256 (the last two absent without a manifest). None when the config names no data folder."""
    data = config.get("data") or {}
    if not data.get("root"):
        return None
    root, clips = Path(data["root"]).resolve(), data.get("clips", DEFAULT_CLIPS_DIR)
    record: dict = {"root": str(root), "clips": clips}
    size = data_clip_size(root, clips)
    if size is not None:
        record.update(clip_size=asdict(size), clip_manifest_sha256=clip_manifest_sha256(root, clips))
    return record


def trained_data(folder: str | Path) -> dict | None:
    """The record :func:`trained_data_record` wrote into an export's ``export.json`` (None: an older export)."""
    record = _export_json(folder).get(TRAINED_DATA_KEY)
    return record if isinstance(record, dict) else None


def trained_root(folder: str | Path, config: dict) -> Path | None:
    """The data folder an export (whose recorded config is ``config``) trained on: the absolute path it
    recorded, else (older exports) its config's ``data.root``."""
    record = trained_data(folder)
    if record and record.get("root"):
        return Path(record["root"])
    root = (config.get("data") or {}).get("root")
    return Path(root) if root else None


def lineage(folder: str | Path) -> list[tuple[str, dict]]:
    """(folder, config) of the export and of every export it was started from, newest first."""
    chain: list[tuple[str, dict]] = []
    seen: set[Path] = set()
    current = str(folder)
    while current and Path(current).resolve() not in seen:
        seen.add(Path(current).resolve())
        config = export_config(current)
        if config is None:
            break
        chain.append((current, config))
        current = str((config.get("phase") or {}).get("init_from") or "")
    return chain


# --------------------------------------------------------------------------- held-out split
def _source_hashes(root: Path, clips_dir: str) -> set[str] | None:
    manifest = _read(clip_manifest(root, clips_dir))
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
            elif theirs & mine:
                problems.append(f"{where} was trained on the same film(s) from data.root={str(trained)!r}, whose "
                                f"held-out split is not this one's: evaluate with data.root={str(trained)!r}")
        if smallest is not None and fraction > smallest[0]:
            trained, source = smallest
            where = f"{key}={folder!r}" + ("" if source == folder else f" (started from {source})")
            problems.append(f"{where} was trained with data.val_fraction={trained}, but this evaluation holds out "
                            f"data.val_fraction={fraction}: it would play shots the model trained on; set "
                            f"data.val_fraction={trained} (or lower)")
    return problems


# --------------------------------------------------------------------------- clip size
@dataclass(frozen=True)
class ClipSize:
    frames: int
    height: int
    width: int
    fps: float

    def __str__(self) -> str:
        return f"{self.frames} frames of {self.width}x{self.height} at {self.fps:g} fps"

    def overrides(self) -> list[str]:
        return [f"pipeline.clips.{k}={getattr(self, k)}" for k in CLIP_SIZE_KEYS]


def clip_size_of(clips) -> ClipSize:
    """The size of a ``pipeline.clips`` node (a config object or a dict)."""
    get = clips.get if isinstance(clips, dict) else lambda k: getattr(clips, k)
    return ClipSize(int(get("frames")), int(get("height")), int(get("width")), float(get("fps")))


def data_clip_size(root: str | Path, clips_dir: str = DEFAULT_CLIPS_DIR) -> ClipSize | None:
    """The clip size a pipeline output's clip shards were cut at (their manifest's config)."""
    manifest = _read(clip_manifest(root, clips_dir))
    clips = (((manifest or {}).get("config") or {}).get("pipeline") or {}).get("clips")
    return clip_size_of(clips) if isinstance(clips, dict) else None


def trained_clip_size(export: str | Path) -> ClipSize | None:
    """The clip size an export was trained at: the one its ``export.json`` recorded when it was written;
    for older exports, that of the clip shards its config's data folder holds now, else the
    ``pipeline.clips`` of its recorded config. None for a folder without ``export.json``."""
    config = export_config(export)
    if config is None:
        return None
    recorded = (trained_data(export) or {}).get("clip_size")
    if isinstance(recorded, dict):
        return clip_size_of(recorded)
    root = trained_root(export, config)
    found = data_clip_size(root, (config.get("data") or {}).get("clips", DEFAULT_CLIPS_DIR)) if root else None
    clips = (config.get("pipeline") or {}).get("clips")
    return found or (clip_size_of(clips) if isinstance(clips, dict) else None)


def recut_since(export: str | Path, root: str | Path, clips_dir: str) -> bool:
    """Whether the clip manifest of ``root`` changed since ``export`` trained on that same folder."""
    record = trained_data(export) or {}
    same = record.get("root") and Path(record["root"]) == Path(root).resolve() and record.get("clips") == clips_dir
    if not (same and record.get("clip_manifest_sha256")):
        return False
    now = clip_manifest_sha256(root, clips_dir)
    return now is not None and now != record["clip_manifest_sha256"]


def renderer_clip_size(exports: list[str]) -> ClipSize | None:
    """The size the last renderer export that records one was trained at."""
    for export in reversed(exports):
        size = trained_clip_size(export)
        if size is not None:
            return size
    return None


def at_clip_size(cfg, size: ClipSize | None):
    """``cfg`` (a typed RunConfig) with ``pipeline.clips`` at ``size``; unchanged when None or equal."""
    if size is None or clip_size_of(cfg.pipeline.clips) == size:
        return cfg
    log.info("rendering at the trained clip size, %s (the config said %s)", size, clip_size_of(cfg.pipeline.clips))
    clips = replace(cfg.pipeline.clips, **asdict(size))
    return replace(cfg, pipeline=replace(cfg.pipeline, clips=clips))


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
