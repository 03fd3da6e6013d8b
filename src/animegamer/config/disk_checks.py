"""Checks that read what is on disk and need no component's code: weight folders' config.json (the shards a
run will read are checked by :mod:`animegamer.data.shapes`). Each returns messages naming the config key;
the validation pass collects them with the rest."""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

from animegamer.utils.io import read_json


# --------------------------------------------------------------------------- sizes recorded on disk
def read_json_object(path: Path) -> dict | None:
    """The JSON object at ``path``, or None where there is none (missing, unreadable, not an object)."""
    try:
        data = read_json(path)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _folder_config(path: str, subfolders: tuple[str, ...]) -> tuple[Path, dict] | None:
    root = Path(path).expanduser()
    for folder in (root, *(root / sub for sub in subfolders)):
        data = read_json_object(folder / "config.json")
        if data is not None:
            return folder, data
    return None


def check_weight_folders(model, parts: Iterable[str]) -> list[str]:
    """Each configured weights folder's ``config.json`` against the sizes the config names.

    Read as json, nothing is loaded: a 7B folder at the wrong sizes fails here, not after minutes of
    loading. Missing folders are reported by the folder checks; a folder without config.json here.
    """
    enc, dec, m = model.encoders, model.decoder, model.mllm
    specs = {  # part: (config key, path, subfolders, {config.json name: configured value})
        "decoder": ("model.decoder.path", dec.path, ("transformer",), {
            "num_layers": dec.num_layers, "num_attention_heads": dec.num_attention_heads,
            "attention_head_dim": dec.attention_head_dim, "in_channels": dec.in_channels,
            "out_channels": dec.out_channels, "patch_size": dec.patch_size, "time_embed_dim": dec.time_embed_dim}),
        "mllm": ("model.mllm.path", m.path, (), {
            "hidden_size": m.hidden_size, "intermediate_size": m.intermediate_size,
            "num_hidden_layers": m.num_hidden_layers, "num_attention_heads": m.num_attention_heads,
            "num_key_value_heads": m.num_key_value_heads}),
        "t5": ("model.encoders.t5.path", enc.t5.path, ("text_encoder",), {
            "d_model": enc.t5.d_model, "num_heads": enc.t5.num_heads, "d_kv": enc.t5.d_kv}),
        "clip": ("model.encoders.clip.path", enc.clip.path, ("image_encoder",), {
            "hidden_size": enc.clip.hidden_size, "image_size": enc.clip.image_size, "patch_size": enc.clip.patch_size}),
        "vae": ("model.encoders.vae.path", enc.vae.path, ("vae",), {
            "latent_channels": enc.vae.latent_channels, "block_out_channels": list(enc.vae.block_out_channels),
            "temporal_compression_ratio": enc.vae.temporal_compression_ratio}),
    }
    problems: list[str] = []
    for part in parts:
        key, path, subfolders, expected = specs[part]
        if not path or not Path(path).expanduser().is_dir():
            continue
        found = _folder_config(path, subfolders)
        if found is None:
            problems.append(f"{key}={path!r}: no config.json in the folder (nor in {list(subfolders)}): "
                            f"not a weights folder")
            continue
        folder, data = found
        if part == "clip" and isinstance(data.get("vision_config"), dict):
            data = data["vision_config"]  # a full CLIPModel folder
        wrong = [f"{name} {data[name]} (folder) vs {value} (config)" for name, value in expected.items()
                 if name in data and data[name] != value]
        if wrong:
            problems.append(f"{key}={path!r}: {folder / 'config.json'} does not match the config: " + "; ".join(wrong))
    return problems
