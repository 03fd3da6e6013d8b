"""Checks that span the networks of a model config: sizes that must agree between the encoder, the frozen
encoders and the decoder, the attention kernels and compile/fp8/caching settings of both models, and
the tokenizer against the token layout, the LLM and the phase (b) exports a run loads.

Each network checks its own settings in its module; training, evaluation and the pipeline compose
these with them in their pre-flights, before any model is built.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

from animegamer.config.disk_checks import read_json_object
from animegamer.config.validate import choice
from animegamer.contracts.exports import TOKENIZER_DIR
from animegamer.diffusion.cfg_parallel import check_cfg_parallel
from animegamer.diffusion.step_cache import check_sampling_cache
from animegamer.mllm.tokens import (ANIMEGAMER_TOKENS, NUM_ANIMEGAMER_TOKENS, TokenIds, add_animegamer_tokens,
                                    load_tokenizer)
from animegamer.mllm.words import WORDS
from animegamer.models.attention_kernels import ATTENTION_BACKENDS, FA4, check_attention_backends
from animegamer.models.decoder import check_decoder_compile
from animegamer.models.encoder import representation_tokens
from animegamer.models.fp8 import check_decoder_fp8
from animegamer.models.mllm import SDPA


# --------------------------------------------------------------------------- tokenizer
def check_tokenizer(model, mllm_exports: Iterable[tuple[str, str]] = (), words_from_data: bool = True) -> list[str]:
    """The configured tokenizer (loaded when its folder exists; it is cheap) against the token layout,
    the LLM folder's embedding rows, the official checkpoint's id order and phase (b) exports.

    ``mllm_exports`` are (config key, folder) pairs of phase (b) exports this run loads: their
    ``adapter/mllm_meta.json`` records the vocabulary, query count, widths they were trained with.
    ``words_from_data``: the run builds the ``words`` tokenizer from its data when an export holds no
    copy (training and evaluation); the pipeline's adaptation step reads no training split, so there
    the newest export must hold it.
    """
    m = model.mllm
    if m.tokenizer == WORDS:
        # Built from the data's training split when the phase runs (animegamer.data.words), unless an
        # export holds the copy it trained with.
        exports = list(mllm_exports)
        if words_from_data or not exports or not Path(exports[-1][1]).is_dir():
            return []  # a missing folder is reported as such
        key, folder = exports[-1]
        if (Path(folder) / TOKENIZER_DIR).is_dir():
            return []
        return [f"{key}={folder!r}: model.mllm.tokenizer={WORDS} needs the phase (b) export's copy of the tokenizer "
                f"it trained with ({TOKENIZER_DIR}/), and there is none"]
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
    add_animegamer_tokens(tokenizer, say=False)  # the check's own copy: the run that loads it says it
    try:
        TokenIds.from_tokenizer(tokenizer)
    except KeyError as exc:
        problems.append(f"{key}={folder!r}: {exc.args[0] if exc.args else exc}")
    rows = len(tokenizer)  # embedding rows of the built MLLM (a random build starts at or below it)
    llm_config = read_json_object(Path(m.path) / "config.json") if m.path else None
    if llm_config and isinstance(llm_config.get("vocab_size"), int):
        if llm_config["vocab_size"] < base:
            problems.append(f"model.mllm.path={m.path!r} has {llm_config['vocab_size']} embedding rows but the "
                            f"tokenizer ({folder}) has {base} tokens before the AnimeGamer ones: the tokenizer "
                            f"belongs to another LLM")
        rows = max(rows, llm_config["vocab_size"])
    expected = {"vocab_size": rows, "num_query_tokens": representation_tokens(model.encoder),
                "rep_width": model.encoder.width, "hidden_size": m.hidden_size}
    for export_key, export in mllm_exports:
        meta = read_json_object(Path(export) / "adapter" / "mllm_meta.json") if export else None
        if not meta:
            continue
        wrong = [f"{name} {meta[name]} (export) vs {value} (this config)" for name, value in expected.items()
                 if name in meta and meta[name] != value]
        if wrong:
            problems.append(f"{export_key}={export!r} does not fit this tokenizer and model ("
                            + "; ".join(wrong) + "): vocab_size is the tokenizer's length with the AnimeGamer "
                            "tokens, num_query_tokens the encoder's representation tokens")
    return problems



def check_model_sizes(model) -> list[str]:
    """Sizes that must agree between the networks: encoder, frozen encoders, decoder."""
    enc, dec, frozen = model.encoder, model.decoder, model.encoders
    problems = []
    hidden = dec.num_attention_heads * dec.attention_head_dim
    if enc.width != hidden:
        problems.append(f"model.encoder.width={enc.width} != decoder hidden {dec.num_attention_heads}x"
                        f"{dec.attention_head_dim}={hidden} (the representation feeds the decoder's text stream)")
    if enc.text_dim != frozen.t5.d_model:
        problems.append(f"model.encoder.text_dim={enc.text_dim} != model.encoders.t5.d_model={frozen.t5.d_model}")
    if enc.text_tokens != frozen.t5.max_tokens:
        problems.append(f"model.encoder.text_tokens={enc.text_tokens} != model.encoders.t5.max_tokens={frozen.t5.max_tokens}")
    if enc.image_dim != frozen.clip.hidden_size:
        problems.append(f"model.encoder.image_dim={enc.image_dim} != model.encoders.clip.hidden_size={frozen.clip.hidden_size}")
    patches = (frozen.clip.image_size // frozen.clip.patch_size) ** 2
    if enc.image_tokens != patches:
        problems.append(f"model.encoder.image_tokens={enc.image_tokens} != CLIP patches ({frozen.clip.image_size}/"
                        f"{frozen.clip.patch_size})^2={patches}")
    if dec.in_channels != frozen.vae.latent_channels:
        problems.append(f"model.decoder.in_channels={dec.in_channels} != model.encoders.vae.latent_channels="
                        f"{frozen.vae.latent_channels}")
    return problems


def check_kernels(model) -> list[str]:
    """Gradient checkpointing and attention kernel settings of the decoder and the MLLM."""
    dec, m = model.decoder, model.mllm
    problems = []
    for key, every in (("model.decoder", dec.gradient_checkpointing_every),
                       ("model.mllm", m.gradient_checkpointing_every)):
        if every < 1:
            problems.append(f"{key}.gradient_checkpointing_every={every} must be >= 1")
    problems += check_attention(model)
    problems += check_decoder_compile(dec, training=True) + check_decoder_fp8(dec) + check_cfg_parallel(dec)
    problems += check_sampling_cache(model.diffusion, dec)
    return problems


def check_attention(model) -> list[str]:
    """Both models' SDPA kernel preferences: known names, ``fa4`` runnable here, and the one process-wide
    flash kernel: FlashAttention-4 for both or for neither."""
    dec, m = model.decoder, model.mllm
    problems = []
    lists = {"model.decoder.attention_backends": list(dec.attention_backends),
             "model.mllm.attention_backends": list(m.attention_backends)}
    for key, backends in lists.items():
        for backend in backends:
            problems += choice(f"{key}[]", str(backend), ATTENTION_BACKENDS)
        problems += check_attention_backends(key, backends)
    fa4 = [key for key, backends in lists.items() if FA4 in backends]
    flash = [key for key, backends in lists.items() if "flash" in backends]
    crossed = [(a, b) for a in fa4 for b in flash if a != b]  # one list naming both is reported above
    if crossed:
        problems.append(f"{crossed[0][0]} names fa4 and {crossed[0][1]} names flash: fa4 replaces the flash kernel "
                        f"for the whole process, so name fa4 in both or flash in neither")
    if m.attention_backends and m.attention != SDPA:
        problems.append(f"model.mllm.attention_backends={list(m.attention_backends)} orders SDPA's kernels, "
                        f"but model.mllm.attention={m.attention!r}: use {SDPA} or leave it empty")
    return problems
