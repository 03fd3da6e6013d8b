"""What an export says about the data it was trained on: its ``export.json`` holds the resolved config
and, written with the export (:func:`trained_data_record`), the data folder as an absolute path, the
clip size its clip manifest recorded and the digest of that manifest's content. Evaluation, the game and fine-tuning
read them so that they never score shots a model trained on and never render or cut clips at a size
the renderer was not trained at, even after the data folder was cut again at another size or the
command runs from another directory. Exports written before the record existed fall back to the
config's ``data.root`` and the clip manifest found there now.

An export started from another (``phase.init_from``) learned from that one's data too, so the split
check follows the chain of exports back to the first.
"""
from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from animegamer.config.schema import TrainDataConfig
from animegamer.contracts.files import EXPORT_FILE, MANIFEST
from animegamer.utils.io import read_json_if_exists

log = logging.getLogger(__name__)

CLIP_SIZE_KEYS = ("frames", "height", "width", "fps")
TRAINED_DATA_KEY = "trained_data"  # export.json's record of the data the run trained on
STARTED_FROM = "init_from"  # the record's absolute phase.init_from
DEFAULT_CLIPS_DIR = TrainDataConfig.clips
# A clip manifest's record of the command line that cut the clips: how it was typed, not what it cut (the
# resolved config beside it says that, the clip size included).
MANIFEST_PROVENANCE = ("command",)


def clip_manifest(root: str | Path, clips_dir: str) -> Path:
    """The manifest of a pipeline output's clip shards."""
    return Path(root) / clips_dir / MANIFEST


def manifest_content_sha256(path: Path) -> str:
    """The sha256 of what a clip manifest says of the clips (the settings that cut them, their films, shards
    with their digests, motion bins, counts), apart from the command line it was started with
    (:data:`MANIFEST_PROVENANCE`): the same clips cut again by a command typed in another order keep it."""
    data = read_json_if_exists(path)
    content = {k: v for k, v in data.items() if k not in MANIFEST_PROVENANCE} if isinstance(data, dict) else data
    return hashlib.sha256(json.dumps(content, sort_keys=True, default=str).encode()).hexdigest()


def clip_manifest_sha256(root: str | Path, clips_dir: str) -> str | None:
    """The digest of a pipeline output's clips (:func:`manifest_content_sha256`); None where there is no
    manifest."""
    manifest = clip_manifest(root, clips_dir)
    return manifest_content_sha256(manifest) if manifest.is_file() else None


def read_object(path: Path) -> dict | None:
    """The JSON object at ``path``; None where there is no such file."""
    data = read_json_if_exists(path)
    return data if isinstance(data, dict) else None


def _export_json(folder: str | Path) -> dict:
    return read_object(Path(folder) / EXPORT_FILE) or {}


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
    sha256 (the last two absent without a manifest), and the export it started from (absolute too, so its
    lineage is found from any directory). None when the config names no data folder."""
    data = config.get("data") or {}
    if not data.get("root"):
        return None
    root, clips = Path(data["root"]).resolve(), data.get("clips", DEFAULT_CLIPS_DIR)
    record: dict = {"root": str(root), "clips": clips}
    init = (config.get("phase") or {}).get("init_from")
    if init:
        record[STARTED_FROM] = str(Path(init).resolve())
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
        # The absolute path the export recorded (an older export: its config's, relative to where it trained).
        current = str((trained_data(current) or {}).get(STARTED_FROM) or (config.get("phase") or {}).get("init_from")
                      or "")
    return chain


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
    manifest = read_object(clip_manifest(root, clips_dir))
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
