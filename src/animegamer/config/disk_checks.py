"""Checks that read what is on disk: the tokenizer, weight folders' config.json, the sizes an export
was trained with, and the first sample of the shards a run will read. Each returns messages naming the
config key; :mod:`animegamer.config.validate` collects them with the rest."""
from __future__ import annotations

import tarfile
from pathlib import Path
from typing import Iterable

LORA_EXPORT_PHASES = ("a_joint", "b", "c")  # phases whose exports also write a peft adapter folder

# --------------------------------------------------------------------------- tokenizer
def check_tokenizer(model, mllm_exports: Iterable[tuple[str, str]] = ()) -> list[str]:
    """The configured tokenizer (loaded when its folder exists; it is cheap) against the token layout,
    the LLM folder's embedding rows, the official checkpoint's id order and phase (b) exports.

    ``mllm_exports`` are (config key, folder) pairs of phase (b) exports this run loads: their
    ``adapter/mllm_meta.json`` records the vocabulary, query count, widths they were trained with.
    """
    from animegamer.mllm.tokens import (
        ANIMEGAMER_TOKENS, NUM_ANIMEGAMER_TOKENS, TokenIds, add_animegamer_tokens, load_tokenizer)
    from animegamer.models.encoder import representation_tokens

    m = model.mllm
    folder = m.tokenizer or m.path
    key = "model.mllm.tokenizer" if m.tokenizer else "model.mllm.path"
    if folder and not Path(folder).is_dir():
        return []  # reported as a missing folder
    try:
        tokenizer = load_tokenizer(folder or None)
    except Exception as exc:  # noqa: BLE001 - any loader failure is a config problem, reported with the rest
        return [f"{key}={folder!r}: the tokenizer does not load: {type(exc).__name__}: {exc}"]
    problems: list[str] = []
    vocab = tokenizer.get_vocab()
    present = [name for name in ANIMEGAMER_TOKENS if name in vocab]
    if present and len(present) != NUM_ANIMEGAMER_TOKENS:
        absent = [name for name in ANIMEGAMER_TOKENS if name not in vocab]
        problems.append(f"{key}={folder!r}: the tokenizer has {len(present)} of the {NUM_ANIMEGAMER_TOKENS} "
                        f"AnimeGamer tokens (missing e.g. {absent[:3]}): it must have all of them (the official "
                        f"tokenizer) or none (a base Mistral tokenizer, to which they are appended in order)")
    elif present and m.official_checkpoint:
        ids = [int(vocab[name]) for name in ANIMEGAMER_TOKENS]
        if ids != list(range(ids[0], ids[0] + NUM_ANIMEGAMER_TOKENS)):
            problems.append(f"{key}={folder!r}: the AnimeGamer tokens are not consecutive ids in the official "
                            f"order, so model.mllm.official_checkpoint's embedding rows would meet other tokens")
    base = len(tokenizer) - len(present)
    add_animegamer_tokens(tokenizer)
    try:
        TokenIds.from_tokenizer(tokenizer)
    except KeyError as exc:
        problems.append(f"{key}={folder!r}: {exc.args[0] if exc.args else exc}")
    rows = len(tokenizer)  # embedding rows of the built MLLM (a random build starts at or below it)
    llm_config = _read_json(Path(m.path) / "config.json") if m.path else None
    if llm_config and isinstance(llm_config.get("vocab_size"), int):
        if llm_config["vocab_size"] < base:
            problems.append(f"model.mllm.path={m.path!r} has {llm_config['vocab_size']} embedding rows but the "
                            f"tokenizer ({folder}) has {base} tokens before the AnimeGamer ones: the tokenizer "
                            f"belongs to another LLM")
        rows = max(rows, llm_config["vocab_size"])
    expected = {"vocab_size": rows, "num_query_tokens": representation_tokens(model.encoder),
                "rep_width": model.encoder.width, "hidden_size": m.hidden_size}
    for export_key, export in mllm_exports:
        meta = _read_json(Path(export) / "adapter" / "mllm_meta.json") if export else None
        if not meta:
            continue
        wrong = [f"{name} {meta[name]} (export) vs {value} (this config)" for name, value in expected.items()
                 if name in meta and meta[name] != value]
        if wrong:
            problems.append(f"{export_key}={export!r} does not fit this tokenizer and model ("
                            + "; ".join(wrong) + "): vocab_size is the tokenizer's length with the AnimeGamer "
                            "tokens, num_query_tokens the encoder's representation tokens")
    return problems


# --------------------------------------------------------------------------- sizes recorded on disk
def _read_json(path: Path) -> dict | None:
    """The JSON object at ``path``, or None where there is none (missing, unreadable, not an object)."""
    from animegamer.utils.io import read_json

    try:
        data = read_json(path)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _folder_config(path: str, subfolders: tuple[str, ...]) -> tuple[Path, dict] | None:
    root = Path(path).expanduser()
    for folder in (root, *(root / sub for sub in subfolders)):
        data = _read_json(folder / "config.json")
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


EXPORT_SIZE_KEYS = {
    "encoder": ("text_dim", "image_dim", "text_tokens", "image_tokens", "width", "fusion", "mlp"),
    "decoder": ("num_layers", "num_attention_heads", "attention_head_dim", "in_channels", "out_channels",
                "patch_size", "time_embed_dim", "motion_scope"),
    "mllm": ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads"),
}
_REP_KEYS = ("text_tokens", "image_tokens", "width", "fusion")  # what fixes N and D for the MLLM


def check_export_sizes(key: str, folder: str, model, parts: tuple[str, ...] | None = None) -> list[str]:
    """The model sizes an export was trained with (``export.json``'s config) against this config's.

    Parts default by the export's phase: encoder and decoder for (a) / (c), the representation's
    N and D plus the LLM for (b). LoRA ranks are compared where the export holds a LoRA."""
    from animegamer.checkpoints.export import EXPORT_FILE

    record = _read_json(Path(folder) / EXPORT_FILE) if folder else None
    saved = ((record or {}).get("config") or {}).get("model")
    if not isinstance(saved, dict):
        return []
    phase = record.get("phase")
    if parts is None:
        parts = ("encoder", "mllm") if phase == "b" else ("encoder", "decoder")
    wrong = []
    for part in parts:
        names = _REP_KEYS if part == "encoder" and phase == "b" else EXPORT_SIZE_KEYS[part]
        if part in ("decoder", "mllm") and phase in LORA_EXPORT_PHASES:
            names = (*names, "lora_rank")
        recorded = saved.get(part) or {}
        for name in names:
            mine = getattr(getattr(model, part), name)
            if name in recorded and recorded[name] != mine:
                wrong.append(f"model.{part}.{name} {recorded[name]} (export) vs {mine} (this config)")
    if wrong:
        return [f"{key}={folder!r} was trained at other sizes: " + "; ".join(wrong)]
    return []


def expected_shapes(cfg) -> dict[str, tuple]:
    """Shapes of the ``.npy`` members a phase reads, from the config (None = any size on that axis)."""
    from animegamer.models.encoder import representation_tokens

    enc, frozen, phase = cfg.model.encoder, cfg.model.encoders, cfg.phase
    latents = (None, frozen.vae.latent_channels, None, None)
    rep = (representation_tokens(enc), enc.width)
    if phase.name == "b":
        return {"reps.npy": (None, *rep)}
    if phase.name == "c":
        return {"latents.npy": latents, "pred_rep.npy": rep}
    if phase.input == "features":
        return {"latents.npy": latents, "text.npy": (enc.text_tokens, enc.text_dim),
                "image.npy": (enc.image_tokens, enc.image_dim)}
    return {}


def _first_sample_shapes(folder: Path) -> dict[str, tuple] | None:
    """``.npy`` member shapes of the first sample of the first shard: tar and npy headers only."""
    import numpy as np

    from animegamer.data.shards import shard_urls

    try:
        shards = shard_urls(folder)
        if not shards:
            return None
        shapes: dict[str, tuple] = {}
        first = None
        with tarfile.open(shards[0], "r:") as tar:
            for info in tar:
                if not info.isfile():
                    continue
                sample, _, ext = Path(info.name).name.partition(".")
                if first is None:
                    first = sample
                elif sample != first:
                    break
                if ext.endswith("npy"):
                    handle = tar.extractfile(info)
                    version = np.lib.format.read_magic(handle)
                    header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                              else np.lib.format.read_array_header_2_0)
                    shapes[ext] = tuple(header(handle)[0])
        return shapes
    except Exception:  # noqa: BLE001 - unreadable data is the data checks' business, not the config's
        return None


def check_shard_shapes(folder: Path, expected: dict[str, tuple]) -> list[str]:
    """The data a phase reads against the sizes of the model it builds (first sample only)."""
    shapes = _first_sample_shapes(folder) if expected else None
    problems = []
    for member, want in expected.items():
        got = (shapes or {}).get(member)
        if got is None:
            continue
        if len(got) != len(want) or any(w is not None and g != w for g, w in zip(got, want)):
            shown = "(" + ", ".join("*" if w is None else str(w) for w in want) + ")"
            problems.append(f"{folder}: {member} has shape {got} but this config's model needs {shown} "
                            f"(data written with other encoder / model sizes)")
    return problems
