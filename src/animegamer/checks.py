"""The validation pass: every component's checks composed over a run config, every problem reported
at once, before any model is built.

Each component holds its choices and checks its own settings (``models/encoder.py``,
``models/mllm.py``, ``models/decoder.py``, ``models/fp8.py``, ``training/strategies.py``, ``training/profiling.py``,
``mllm/collate.py``, ``training/bad_data.py``, ``phases/common.py``); each phase's own fields and
needs are checked by its spec (``phases/specs.py``). This module composes them with the checks that
span components: sizes that must agree between networks, the tokenizer against the layout and the
LLM, exports and shards against the config. The settings-only helpers and checks that need no
component's code stay in :mod:`animegamer.config`.
"""
from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Iterable, Sequence

from omegaconf import DictConfig, OmegaConf

from animegamer.checkpoints.export import EXPORT_FILE, export_folder_problems
from animegamer.data.trained_data import clip_size_problems, split_problems
from animegamer.config.disk_checks import check_weight_folders, read_json_object
from animegamer.data.shapes import check_shard_shapes
from animegamer.config.validate import (PIPELINE_STEPS, ConfigError, check_encoders, check_pipeline, choice,
                                        local_folder, positive)
from animegamer.contracts.files import MANIFEST
from animegamer.data.storage import check_remote_settings, data_source, is_url
from animegamer.models.attention_kernels import ATTENTION_BACKENDS, FA4, check_attention_backends
from animegamer.diffusion.cfg_parallel import check_cfg_parallel
from animegamer.diffusion.step_cache import check_sampling_cache
from animegamer.game import check_batch_games
from animegamer.models.decoder import check_decoder_compile
from animegamer.models.encoder import check_encoder_config, representation_tokens
from animegamer.models.fp8 import check_decoder_fp8
from animegamer.models.mllm import SDPA, check_mllm
from animegamer.evaluation.judge import check_judge
from animegamer.phases.common import check_schedule
from animegamer.preflight import evaluation_problems
from animegamer.phases.specs import PHASES, export_contract
from animegamer.training.loggers import LOGGERS
from animegamer.training.profiling import check_profiler
from animegamer.training.strategies import check_strategy


# --------------------------------------------------------------------------- tokenizer
def check_tokenizer(model, mllm_exports: Iterable[tuple[str, str]] = ()) -> list[str]:
    """The configured tokenizer (loaded when its folder exists; it is cheap) against the token layout,
    the LLM folder's embedding rows, the official checkpoint's id order and phase (b) exports.

    ``mllm_exports`` are (config key, folder) pairs of phase (b) exports this run loads: their
    ``adapter/mllm_meta.json`` records the vocabulary, query count, widths they were trained with.
    """
    from animegamer.mllm.tokens import (  # transformers: loaded only where a tokenizer is checked
        ANIMEGAMER_TOKENS, NUM_ANIMEGAMER_TOKENS, TokenIds, add_animegamer_tokens, load_tokenizer)

    from animegamer.mllm.words import WORDS

    m = model.mllm
    if m.tokenizer == WORDS:
        return []  # built from the data's training split when the phase runs (animegamer.mllm.words)
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


# --------------------------------------------------------------------------- exports
EXPORT_SIZE_KEYS = {
    "encoder": ("text_dim", "image_dim", "text_tokens", "image_tokens", "width", "fusion", "mlp"),
    "decoder": ("num_layers", "num_attention_heads", "attention_head_dim", "in_channels", "out_channels",
                "patch_size", "time_embed_dim", "motion_scope"),
    "mllm": ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads"),
}
REPRESENTATION_KEYS = ("text_tokens", "image_tokens", "width", "fusion")  # what fixes N and D for the MLLM
LORA_PARTS = ("decoder", "mllm")  # the networks that carry a LoRA


# what an export given for a role must hold, and where users find one that does
EXPORT_ROLES = {"mllm": ("mllm", "the game-state MLLM: a phase (b) export, e.g. b/export"),
                "renderer": ("decoder", "a renderer: a phase (a) or (c) export, e.g. a_joint/export or c/export")}


def check_export_role(key: str, folder: str, role: str) -> list[str]:
    """``folder`` (given as ``key``) holds what ``role`` needs, by the phase its ``export.json`` names (an
    MLLM export where a renderer is wanted would otherwise fail while loading, as a traceback)."""
    record = read_json_object(Path(folder) / EXPORT_FILE) if folder else None
    phase = (record or {}).get("phase")
    part, wanted = EXPORT_ROLES[role]
    if not isinstance(phase, str) or phase not in PHASES or part in export_contract(phase).parts:
        return []
    return [f"{key}={folder!r} is a phase {phase} export, which holds no {part}; {key} wants {wanted}"]


def check_export_sizes(key: str, folder: str, model, parts: tuple[str, ...] | None = None) -> list[str]:
    """The model sizes an export was trained with (``export.json``'s config) against this config's.

    Parts default to what the export's phase exports (its spec's export contract): encoder and
    decoder for (a) / (c), the representation's N and D plus the LLM for (b). LoRA ranks are compared
    where the export holds a LoRA adapter."""
    record = read_json_object(Path(folder) / EXPORT_FILE) if folder else None
    saved = ((record or {}).get("config") or {}).get("model")
    if not isinstance(saved, dict):
        return []
    contract = export_contract(record.get("phase"))
    wrong = []
    for part in contract.parts if parts is None else parts:
        names = REPRESENTATION_KEYS if part == "encoder" and contract.rep_only else EXPORT_SIZE_KEYS[part]
        if part in LORA_PARTS and contract.lora_adapter:
            names = (*names, "lora_rank")
        recorded = saved.get(part) or {}
        for name in names:
            mine = getattr(getattr(model, part), name)
            if name in recorded and recorded[name] != mine:
                wrong.append(f"model.{part}.{name} {recorded[name]} (export) vs {mine} (this config)")
    if wrong:
        return [f"{key}={folder!r} was trained at other sizes: " + "; ".join(wrong)]
    return []


# --------------------------------------------------------------------------- pipeline
def validate_pipeline_run(cfg, refused: Sequence[str] = ()) -> None:
    """Raise :class:`ConfigError` listing every problem of a pipeline run config. A run refused (for its
    settings, or for ``refused``: the problems a recipe found in its other stages) names its films' and
    caption import's problems in the same message: the pipeline's pre-flight would otherwise tell of them
    only in the run after these are fixed."""
    problems = pipeline_problems(cfg)
    if problems or refused:
        from data_pipeline.preflight import film_problems  # late: the pipeline's readers, for a refusal only

        problems += film_problems(cfg.pipeline, cfg.pipeline.steps or PIPELINE_STEPS)
        raise ConfigError(list(dict.fromkeys([*problems, *refused])))


def pipeline_problems(cfg) -> list[str]:
    """Every problem of a pipeline run config's settings and the exports it reads."""
    p = cfg.pipeline
    problems = check_pipeline(p, cfg.model.encoders)
    steps = p.steps or PIPELINE_STEPS
    reps, adaptation = p.representations.export, p.adaptation.export
    if reps:
        problems += export_folder_problems(f"pipeline.representations.export={reps!r}", reps,
                                           "not a phase (a) export folder")
    if adaptation:
        problems += export_folder_problems(f"pipeline.adaptation.export={adaptation!r}", adaptation,
                                           "not a phase (b) export folder")
    if "precompute" in steps and p.precompute.enabled:
        problems += check_encoders(cfg.model.encoders)
        problems += check_weight_folders(cfg.model, ("t5", "clip", "vae"))
    if reps and "representations" in steps:
        problems += (check_export_role("pipeline.representations.export", reps, "renderer")
                     or check_export_sizes("pipeline.representations.export", reps, cfg.model, ("encoder",)))
    if adaptation and "adaptation" in steps:
        problems += check_export_role("pipeline.adaptation.export", adaptation, "mllm")
        problems += check_mllm(cfg.model)
        problems += check_tokenizer(cfg.model, [("pipeline.adaptation.export", adaptation)])
        problems += check_export_sizes("pipeline.adaptation.export", adaptation, cfg.model)
    return problems


# --------------------------------------------------------------------------- training
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


def _schema_of(node) -> type:
    return OmegaConf.get_type(node) if isinstance(node, DictConfig) else type(node)


def check_phase_schema(cfg, spec) -> list[str]:
    """The phase node is the named phase's config (``phase=b phase.name=c`` is not phase c) and holds
    nothing else (``+phase.pack_tokens=...`` on phase (a) would be dropped unread)."""
    schema = _schema_of(cfg.phase)
    if schema is not spec.config:
        return [f"phase.name={spec.name!r} is configured by {spec.config.__name__}, but the phase node is a "
                f"{schema.__name__}: choose the phase with phase={spec.name} instead of overriding phase.name"]
    known = [f.name for f in fields(spec.config)]
    return [f"phase.{key} is not a setting of phase {spec.name} ({spec.config.__name__} has {', '.join(known)})"
            for key in cfg.phase.keys() if key not in known] if isinstance(cfg.phase, DictConfig) else []


def check_trainer(cfg) -> list[str]:
    """Devices and accumulation, the profiler, and the strategy against what the phase exports."""
    t = cfg.trainer
    problems: list[str] = []
    if t.devices < 1 and t.devices != -1:
        problems.append(f"trainer.devices={t.devices} must be >= 1 (or -1: every visible device)")
    if t.num_nodes < 1:
        problems.append(f"trainer.num_nodes={t.num_nodes} must be >= 1")
    if t.accumulate_grad_batches < 1:
        problems.append(f"trainer.accumulate_grad_batches={t.accumulate_grad_batches} must be >= 1")
    problems += check_profiler(cfg)
    problems += check_strategy(cfg)
    return problems


def check_phase(cfg, spec, data: bool = True) -> list[str]:
    """What the configured phase needs: its own checks (its spec's), the weights, frozen encoders and
    shards it reads (``data`` False: not the shards, which a recipe makes after checking its stages)."""
    phase, model = cfg.phase, cfg.model
    problems = check_phase_schema(cfg, spec)
    if _schema_of(phase) is not spec.config:  # the phase's own checks read fields this node does not have
        return problems + (data_root_problems(cfg) if data else [])
    for check in spec.checks:
        problems += check(cfg)
    problems += check_weight_folders(model, spec.weights)
    if data:
        problems += sample_shard_problems(cfg, spec)
    frozen = spec.frozen_encoders(cfg)
    problems += check_encoders(model.encoders, frozen) + check_weight_folders(model, frozen)
    return problems


def data_root_problems(cfg) -> list[str]:
    """A local ``data.root`` that does not exist, where the phase's own shards cannot be named (an unknown
    phase, or the node of another phase): whichever phase is meant, its shards are not there."""
    root = str(cfg.data.root)
    if is_url(root) or Path(root).is_dir():
        return []
    return [f"data.root={root!r}: no such folder; run the pipeline first (python -m data_pipeline ...) or set "
            f"data.root"]


def sample_shard_problems(cfg, spec) -> list[str]:
    """The phase's sample shards: there, and of the shapes this config makes."""
    source = data_source(cfg.data, getattr(cfg.data, spec.sample_key(cfg.phase)))  # a folder or a URL
    missing = source.manifest_problem()
    if missing is None:
        return check_shard_shapes(source, spec.sample_shapes(cfg))
    if source.remote:
        return [f"data.root={cfg.data.root!r}: {missing}"]
    return [f"{missing}; run the pipeline first (python -m data_pipeline ...) or set data.root"]


def check_training(cfg, data: bool = True) -> list[str]:
    """Phase, model and data agreement: the phase's own needs, sizes between encoders, encoder and
    decoder, the trainer, the exports it starts from (``data`` False: not the shards, for a recipe
    checking a stage before they are made)."""
    from animegamer.training.bad_data import check_bad_sample_budget  # Lightning: training runs only

    phase, model = cfg.phase, cfg.model
    problems = check_schedule(phase)
    problems += choice("logger.kind", cfg.logger.kind, LOGGERS)
    problems += check_encoder_config(model.encoder)
    problems += positive("phase", phase, ("max_steps", "lr", "batch_size"))
    spec = PHASES.get(phase.name)
    if spec is None:
        problems += choice("phase.name", phase.name, PHASES) + (data_root_problems(cfg) if data else [])
    else:
        problems += check_phase(cfg, spec, data)
    problems += check_model_sizes(model)
    problems += check_kernels(model)
    problems += check_trainer(cfg)
    if phase.init_from:
        problems += check_export_sizes("phase.init_from", phase.init_from, model)
    dec = model.decoder
    problems += local_folder("model.decoder.path", dec.path)
    if dec.official_checkpoint and not Path(dec.official_checkpoint).exists():
        problems.append(f"model.decoder.official_checkpoint={dec.official_checkpoint!r}: no such file or folder")
    if phase.init_from:
        problems += export_folder_problems(f"phase.init_from={phase.init_from!r}", phase.init_from,
                                           "no such export folder", "train the earlier stage first")
    if not 0 < cfg.data.val_fraction < 1:
        problems.append(f"data.val_fraction={cfg.data.val_fraction} must be in (0, 1)")
    problems += check_bad_sample_budget(cfg.data.bad_sample_budget) + check_remote_settings(cfg.data)
    return problems


def validate_train_run(cfg, machine: bool = False) -> None:
    """Raise :class:`ConfigError` listing every problem of a training run config (``machine``: and what this
    machine lacks for it, a GPU; ``train.py`` asks, a config checked elsewhere is not refused for it)."""
    from animegamer.config.validate import check_gpu_available

    problems = check_training(cfg) + (check_gpu_available(cfg.trainer) if machine else [])
    if problems:
        raise ConfigError(problems)


# --------------------------------------------------------------------------- evaluation
def validate_eval_run(cfg) -> None:
    """Exports, shards and the model sizes an evaluation needs, all checked before anything loads."""
    problems = check_evaluation(cfg)
    if problems:
        raise ConfigError(problems)


def check_evaluation(cfg, made: bool = True) -> list[str]:
    """Every problem of an evaluation config. ``made`` False: its exports and data are made later (a recipe
    checking its evaluation before its first stage): only its settings and the files it is given."""
    e = cfg.evaluation
    problems = []
    if made:
        for key in ("mllm_export", "renderer_export"):
            path = getattr(e, key)
            problems += export_folder_problems(f"evaluation.{key}={path!r}", path, hint="train the phase first")
        if e.reconstruction_export:
            problems += export_folder_problems(f"evaluation.reconstruction_export={e.reconstruction_export!r}",
                                               e.reconstruction_export, "not a phase (a) export folder")
    if e.benchmark:
        from animegamer.evaluation.runner import benchmark_file_problems  # late: evaluation loads the data readers

        problems += benchmark_file_problems(e.benchmark)  # its game ids become folders under evaluation.out
    root = Path(cfg.data.root)
    for folder in (cfg.data.clips, cfg.data.sessions) if made else ():
        if not (root / folder / MANIFEST).exists():
            problems.append(f"{root / folder}/manifest.json: missing; run the pipeline first")
    if e.games <= 0 or e.turns <= 0:
        problems.append("evaluation.games and evaluation.turns must be > 0")
    problems += check_batch_games("evaluation.batch_games", e.batch_games)
    problems += check_judge(e.judge)
    problems += check_mllm(cfg.model) + check_encoders(cfg.model.encoders, ("vae",)) + check_attention(cfg.model)
    problems += check_decoder_compile(cfg.model.decoder, training=False) + check_decoder_fp8(cfg.model.decoder)
    problems += check_cfg_parallel(cfg.model.decoder) + check_sampling_cache(cfg.model.diffusion, cfg.model.decoder)
    problems += check_tokenizer(cfg.model, [("evaluation.mllm_export", e.mllm_export)])
    problems += check_weight_folders(cfg.model, ("mllm", "decoder", "vae"))
    if not made:
        return problems
    for key, role in (("mllm_export", "mllm"), ("renderer_export", "renderer"), ("reconstruction_export", "renderer")):
        role_problems = check_export_role(f"evaluation.{key}", getattr(e, key), role)
        problems += role_problems or check_export_sizes(f"evaluation.{key}", getattr(e, key), cfg.model)
    problems += check_evaluated_exports(cfg, ("mllm_export", "renderer_export", "reconstruction_export"))
    if not e.benchmark and (root / cfg.data.clips / MANIFEST).exists():
        problems += evaluation_problems(cfg)
    from animegamer.evaluation.runner import untrained_game_problems  # late: evaluation loads the data readers

    problems += untrained_game_problems(cfg)
    return problems


def check_evaluated_exports(cfg, keys: tuple[str, ...]) -> list[str]:
    """The held-out split and clip size each evaluated export was trained with, against this evaluation's."""
    exports = [(f"evaluation.{key}", getattr(cfg.evaluation, key)) for key in keys]
    renderers = [(k, f) for k, f in exports if not k.endswith("mllm_export")]
    return split_problems(cfg, exports) + clip_size_problems(cfg, renderers)
