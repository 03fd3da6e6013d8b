"""Portable export: the parameters a phase trained, as safetensors, plus a self-describing json.

An export is what the next phase (or a user) loads; the Lightning checkpoint beside it is only for
resuming. Frozen weights are not in it: they come from the base model the config names, and the
json records that config so the export says what it belongs to, and what the run trained on (the
data folder as an absolute path, its clip size and clip manifest digest: see
`animegamer.checkpoints.trained_data`), so that a data folder cut again later cannot change it.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Mapping

import torch
from torch import nn

from animegamer.checkpoints.safe_load import load_safetensors
from animegamer.checkpoints.trained_data import TRAINED_DATA_KEY, trained_data_record
from animegamer.config.disk_checks import read_json_object
from animegamer.contracts.files import EXPORT_FILE, TRAINED_FILE
from animegamer.utils.io import atomic_dir, save_tensors
from animegamer.utils.state import clean_name, require

log = logging.getLogger(__name__)

FINISHED = "finished"  # export.json: written once its run reached phase.max_steps (false: a checkpoint's)
FORMAT_VERSION = 1


def trained_state(module: nn.Module, extra: tuple[str, ...] = (),
                  state: Mapping[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """Every trainable parameter (and those under the ``extra`` prefixes), detached, on CPU.

    ``state``: whole tensors gathered elsewhere (FSDP saves), read instead of the module's sharded
    parameters, under the module's parameter names without FSDP's wrapper prefixes."""
    kept = [(clean_name(n), p) for n, p in module.named_parameters() if p.requires_grad or clean_name(n).startswith(extra)]
    if state is None:
        return {n: p.detach().to("cpu").contiguous() for n, p in kept}
    require(state, [n for n, _ in kept])
    return {n: state[n].detach().to("cpu").contiguous() for n, _ in kept}


def save_export(folder: str | Path, module: nn.Module, meta: dict, extra: tuple[str, ...] = (),
                state: Mapping[str, torch.Tensor] | None = None) -> Path:
    """Write ``trained.safetensors`` + ``export.json`` atomically (a killed save leaves the old one).

    ``extra`` adds frozen parameters by name prefix, for exports that must stand alone (phase (c)
    carries the encoder it did not train, so a renderer loads from one folder). ``state``: see
    :func:`trained_state`. A ``meta["config"]`` (the resolved run config) adds the record of the data
    the run trained on (:func:`animegamer.checkpoints.trained_data.trained_data_record`)."""
    folder = Path(folder)
    state = trained_state(module, extra, state)
    config = meta.get("config")
    trained = trained_data_record(config) if isinstance(config, dict) else None
    with atomic_dir(folder) as tmp:
        save_tensors(state, tmp / TRAINED_FILE)
        record = {"format_version": FORMAT_VERSION, "tensors": len(state),
                  "parameters": int(sum(t.numel() for t in state.values())),
                  **({TRAINED_DATA_KEY: trained} if trained else {}), **meta}
        (tmp / EXPORT_FILE).write_text(json.dumps(record, indent=2, sort_keys=True, default=str))
    return folder


def export_folder_problems(label: str, folder: str | Path, what: str = "not an export folder", hint: str = "") -> list[str]:
    """Why ``folder`` (given as ``label``, e.g. ``--mllm DIR`` or ``evaluation.mllm_export='DIR'``) is no
    export folder, each reason ``"<label>: <what>..."``: it is not given, it does not exist (a mistyped
    path is called so), or it holds no ``trained.safetensors``. ``hint``: how to get one."""
    hint = f" ({hint})" if hint else ""
    if not str(folder):
        return [f"{label}: {what}{hint}"]
    path = Path(folder)
    if not path.exists():
        return [f"{label}: {what}: {path} does not exist{hint}"]
    if not (path / TRAINED_FILE).is_file():
        return [f"{label}: {what}: {path} holds no {TRAINED_FILE}{hint}"]
    return []


def load_export(folder: str | Path, module: nn.Module, prefixes: tuple[str, ...] = ()) -> list[str]:
    """Load an export into ``module``; every tensor must find its parameter with the same shape.

    ``prefixes`` limits loading to names starting with them (e.g. only the encoder). Returns the
    names loaded.
    """
    folder = Path(folder)
    path = folder / TRAINED_FILE
    if not path.exists():
        raise FileNotFoundError(f"{folder}: not an export folder (no {TRAINED_FILE})")
    warn_if_unfinished(folder)
    tensors = load_safetensors(path, (lambda key: key.startswith(prefixes)) if prefixes else None)
    params = dict(module.named_parameters())
    problems = [f"{k}: not in the model" for k in tensors if k not in params]
    problems += [f"{k}: shape {tuple(v.shape)} != {tuple(params[k].shape)}" for k, v in tensors.items()
                 if k in params and params[k].shape != v.shape]
    if problems:
        raise ValueError(f"{path}: cannot load {len(problems)} tensors:\n  " + "\n  ".join(problems[:20]))
    with torch.no_grad():
        for name, value in tensors.items():
            params[name].copy_(value.to(params[name].dtype))
    log.info("loaded %d tensors from %s", len(tensors), folder)
    return sorted(tensors)


def warn_if_unfinished(folder: Path) -> bool:
    """Warn when ``folder`` is the export of a run stopped (or still training) before ``phase.max_steps``:
    exports are rewritten at every checkpoint, so one may be a partial result. Returns whether it is."""
    record = read_json_object(folder / EXPORT_FILE) or {}
    if record.get(FINISHED) is not False:  # finished, or written before this was recorded
        return False
    log.warning("%s: exported at step %s of %s: its run stopped (or is still training) before its last step; "
                "run it again to finish it", folder, record.get("step"), record.get("max_steps"))
    return True


def recorded_start(export: str | Path) -> tuple[int | None, list[str]]:
    """What the run that wrote ``export`` built its network from before training: its seed (None where
    unrecorded) and its ``phase.init_from`` exports. An export holds only the trained tensors; a
    random-weight preset's frozen rest comes from that seed, so loading the export over a network built
    with another seed gives another network."""
    saved = ((read_json_object(Path(export) / EXPORT_FILE) or {}).get("config")) or {}
    init = (saved.get("phase") or {}).get("init_from") or ""
    return saved.get("seed"), [init] if init else []
