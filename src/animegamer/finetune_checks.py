"""The fine-tune's own checks, before anything is cut or trained (``animegamer finetune``,
:mod:`animegamer.finetune`): the caption source, the output folder, the frozen weight folders
its ``--from`` exports were trained over, and films those exports already trained on elsewhere.
"""
from __future__ import annotations

import functools
from pathlib import Path

from omegaconf import OmegaConf

from animegamer.checkpoints.trained_data import (DEFAULT_CLIPS_DIR, clip_manifest, export_config, lineage, read_object,
                                                  trained_root)
from animegamer.config.compose import compose_config, override_key, path_override
from animegamer.contracts.exports import A_JOINT
from animegamer.utils.io import sha256_file

CAPTION_IMPORT = "jsonl"  # the caption backend that reads --captions; the others caption with a model or not at all
NO_CAPTIONS = "none"
# The frozen weights a preset's stages load from folders (empty: random at the preset's sizes): the fine-tune
# loads those its --from exports were trained over, since their trained weights fit only them.
FROZEN_FOLDERS = ("model.encoders.t5.path", "model.encoders.clip.path", "model.encoders.vae.path",
                  "model.decoder.path", "model.mllm.path")


def caption_problems(captions: str, backend: str, overrides: list[str]) -> list[str]:
    """What ``--captions`` lacks or contradicts under the caption backend ``backend`` (the composed
    ``pipeline.caption.backend``): the caption import needs a file (``--captions``, or a
    ``pipeline.caption.path`` override), a backend that captions with a model (or none) reads none."""
    if backend == CAPTION_IMPORT:
        if captions or any(override_key(o) == "pipeline.caption.path" for o in overrides):
            return []
        return ["--captions: missing: name the film's caption file (the caption import format, docs/pipeline.md), "
                "or caption it with a model (pipeline.caption.backend=vlm with pipeline.caption.model_path=..., "
                "or pipeline.caption.backend=http)"]
    if captions:
        does = "captions no clip" if backend == NO_CAPTIONS else "captions the clips with a model"
        return [f"--captions {captions!r} is a caption import, but pipeline.caption.backend={backend} {does}: "
                f"leave out --captions or the backend override"]
    return []


def out_problems(start: Path, out: Path) -> list[str]:
    """``--out`` naming ``--from``'s own folder: the fine-tune would cut its film into that run's pipeline
    folder and train over its phases' runs, so it is refused before anything is written."""
    if out.resolve() != start.resolve():
        return []
    return [f"--out {out}: the same folder as --from: the fine-tune would write its film's clips and its phases "
            f"over the run it starts from; give it a folder of its own (e.g. --out {out.resolve()}_finetuned)"]


def frozen_folder_overrides(start: Path, model: str, overrides: list[str]) -> list[str]:
    """``key=folder`` for each of :data:`FROZEN_FOLDERS` that ``start``'s ``a_joint/export`` recorded and the
    preset ``model`` would load otherwise, unless ``overrides`` name the key."""
    recorded = OmegaConf.create(export_config(start / A_JOINT / "export") or {})
    given = {override_key(o) for o in overrides}
    preset = compose_config("train", [f"model={model}"])
    found = []
    for key in FROZEN_FOLDERS:
        folder = OmegaConf.select(recorded, key, default=None)
        if key not in given and folder and folder != OmegaConf.select(preset, key):
            found.append(path_override(key, folder))
    return found


def _trained_sources(root: Path, clips: str) -> list[dict]:
    sources = (read_object(clip_manifest(root, clips)) or {}).get("sources")
    return [s for s in sources if isinstance(s, dict) and s.get("sha256")] if isinstance(sources, list) else []


def trained_film_problems(films: list[Path], start: Path, exports: list[Path], evaluated) -> list[str]:
    """What the held-out split needs of ``--from``, before anything is cut or trained: the evaluation plays
    the shots held out at ``data.val_fraction`` of the fine-tune's data folder (``evaluated``, its composed
    config), so no export it starts from (``exports`` and those they were started from) may have trained
    on them. One trained in another data folder on one of ``films`` (by the sha256 its clip manifest
    records) split them otherwise; one trained in this data folder must have held out at least as much.
    One problem per data folder, naming every export that trained there."""
    root, clips, fraction = Path(evaluated.data.root).resolve(), evaluated.data.clips, evaluated.data.val_fraction
    elsewhere: dict[tuple[Path, str], list[str]] = {}
    smallest: tuple[float, str] | None = None  # the smallest fraction an export held out in this data folder
    for export in exports:
        for source, config in lineage(export):
            data = config.get("data") or {}
            trained = trained_root(source, config)
            if trained is None:
                continue
            trained_clips = data.get("clips", DEFAULT_CLIPS_DIR)
            if trained.resolve() == root and trained_clips == clips:
                if "val_fraction" in data and (smallest is None or data["val_fraction"] < smallest[0]):
                    smallest = (data["val_fraction"], source)
            else:
                sources = elsewhere.setdefault((trained, trained_clips), [])
                if source not in sources:
                    sources.append(source)
    problems = []
    digest = functools.cache(sha256_file)  # read once, and only where a trained film has its size: films are large
    for (trained, trained_clips), sources in elsewhere.items():
        theirs = _trained_sources(trained, trained_clips)
        sizes = {s.get("size") for s in theirs}
        names = [str(film) for film in films if (None in sizes or film.stat().st_size in sizes)
                 and digest(film) in {s["sha256"] for s in theirs}]
        if names:
            them = "it" if len(names) == 1 else "them"
            problems.append(
                f"--from {str(start)!r}: {', '.join(sources)} trained on {', '.join(names)} (--film) in "
                f"data.root={str(trained)!r}, whose held-out shots are not this fine-tune's: its evaluation would "
                f"play shots the model trained on. Fine-tune on footage they never trained on (leave {them} out "
                f"of --film) or from exports that never trained on {them}; to train these exports longer on {them}, "
                f"run the command that made them again with more steps (its stages resume)")
    if smallest is not None and fraction > smallest[0]:
        problems.append(f"--from {str(start)!r}: {smallest[1]} trained in this fine-tune's data folder {str(root)!r} "
                        f"holding out data.val_fraction={smallest[0]}, but the fine-tune holds out "
                        f"data.val_fraction={fraction}: its evaluation would play shots the model trained on; set "
                        f"data.val_fraction={smallest[0]} (or lower)")
    return problems
