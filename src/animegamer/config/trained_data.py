"""What an export says about the data it was trained on (its ``export.json`` holds the resolved config):
the held-out split and the clip size. Evaluation, the game and fine-tuning read them so that they never
score shots a model trained on and never render or cut clips at a size the renderer was not trained at.

An export started from another (``phase.init_from``) learned from that one's data too, so the split
check follows the chain of exports back to the first.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path

from animegamer.config.disk_checks import _read_json as _read

log = logging.getLogger(__name__)

CLIP_SIZE_KEYS = ("frames", "height", "width", "fps")


def export_config(folder: str | Path) -> dict | None:
    """The resolved config recorded in an export folder's ``export.json`` (None if it has none)."""
    from animegamer.checkpoints.export import EXPORT_FILE

    config = (_read(Path(folder) / EXPORT_FILE) or {}).get("config")
    return config if isinstance(config, dict) else None


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
def _source_hashes(clips_folder: Path) -> set[str] | None:
    manifest = _read(clips_folder / "manifest.json")
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
    mine = _source_hashes(root / clips)
    problems: list[str] = []
    for key, folder in exports:
        smallest: tuple[float, str] | None = None  # the smallest fraction this data was trained with, and where
        for source, config in (lineage(folder) if folder else []):
            data = config.get("data") or {}
            if "root" not in data or "val_fraction" not in data:
                continue
            trained_root, trained_clips = Path(data["root"]), data.get("clips", clips)
            if trained_root.resolve() == root.resolve() and trained_clips == clips:
                if smallest is None or data["val_fraction"] < smallest[0]:
                    smallest = (data["val_fraction"], source)
                continue
            theirs = _source_hashes(trained_root / trained_clips)
            where = f"{key}={folder!r}" + ("" if source == folder else f" (started from {source})")
            if theirs is None or mine is None:
                if source == folder:
                    problems.append(f"{where} was trained on data.root={data['root']!r}, which cannot be compared "
                                    f"with this evaluation's data.root={str(root)!r} (no clip manifest): evaluate "
                                    f"with data.root={data['root']!r}")
            elif theirs & mine:
                problems.append(f"{where} was trained on the same film(s) from data.root={data['root']!r}, whose "
                                f"held-out split is not this one's: evaluate with data.root={data['root']!r}")
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


def data_clip_size(root: str | Path, clips_dir: str = "clips") -> ClipSize | None:
    """The clip size a pipeline output's clip shards were cut at (their manifest's config)."""
    manifest = _read(Path(root) / clips_dir / "manifest.json")
    clips = (((manifest or {}).get("config") or {}).get("pipeline") or {}).get("clips")
    return clip_size_of(clips) if isinstance(clips, dict) else None


def trained_clip_size(export: str | Path) -> ClipSize | None:
    """The clip size an export was trained at: that of the clip shards it read (their manifest), else
    the ``pipeline.clips`` of its recorded config; None for a folder without ``export.json``."""
    config = export_config(export)
    if config is None:
        return None
    data = config.get("data") or {}
    found = data_clip_size(data["root"], data.get("clips", "clips")) if data.get("root") else None
    clips = (config.get("pipeline") or {}).get("clips")
    return found or (clip_size_of(clips) if isinstance(clips, dict) else None)


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
    clips = replace(cfg.pipeline.clips, frames=size.frames, height=size.height, width=size.width, fps=size.fps)
    return replace(cfg, pipeline=replace(cfg.pipeline, clips=clips))


def clip_size_problems(cfg, exports: list[tuple[str, str]]) -> list[str]:
    """Exports evaluated on ``cfg.data.root`` must have been trained at its clips' size."""
    data = data_clip_size(cfg.data.root, cfg.data.clips)
    problems = []
    for key, folder in exports:
        trained = trained_clip_size(folder) if folder else None
        if data is not None and trained is not None and trained != data:
            problems.append(f"{key}={folder!r} was trained on clips of {trained}, but the clips in "
                            f"{Path(cfg.data.root) / cfg.data.clips} are {data}: evaluate on a pipeline output cut "
                            f"at the trained size")
    return problems
