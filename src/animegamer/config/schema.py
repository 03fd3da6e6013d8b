"""Typed schemas of every config node, registered in Hydra's ConfigStore.

YAML files under ``configs/`` only override these defaults; anything not named here is rejected by
OmegaConf's structured merge, so a typo in an override fails at composition time.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

CONSTANT_SCHEDULE, COSINE_SCHEDULE = "constant", "cosine"
# Keys that other modules name (in overrides, refusals and run records).
MAX_STEPS_KEY, INIT_FROM_KEY = "phase.max_steps", "phase.init_from"
DATA_ROOT_KEY = "data.root"
LR_SCHEDULES = (CONSTANT_SCHEDULE, COSINE_SCHEDULE)  # phase.lr_schedule
# A remote data folder's reads (data.remote_*): how often a failed request is sent again, and its seconds.
DEFAULT_RETRIES = 3
DEFAULT_TIMEOUT_S = 60.0
# Paper numbers that several nodes derive from (see docs/architecture.md, 'Clip shards' and 'Networks').
PAPER_CLIP_FPS = 8
PAPER_CLIP_FRAMES = 17
PAPER_CLIP_HEIGHT = 480
PAPER_CLIP_WIDTH = 720
NUM_MOTION_LEVELS = 5
PAPER_TEXT_TOKENS = 30


# --------------------------------------------------------------------------- frozen encoders
@dataclass
class T5Config:
    """T5 v1.1 encoder. ``path`` = local HF folder; empty -> random weights at the sizes below."""

    path: str = ""
    d_model: int = 4096
    d_kv: int = 64
    d_ff: int = 10240
    num_layers: int = 24
    num_heads: int = 64
    vocab_size: int = 32128
    max_tokens: int = PAPER_TEXT_TOKENS
    # CogVideoX (diffusers and the official SAT code) run T5 without an attention mask, so the
    # pretrained decoder saw padding positions computed that way; keep it off to match them.
    attention_mask: bool = False


@dataclass
class ClipVisionConfig:
    """CLIP ViT vision tower (penultimate-layer patch tokens, CLS dropped)."""

    path: str = ""
    hidden_size: int = 768
    intermediate_size: int = 3072
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    image_size: int = 224
    patch_size: int = 16


@dataclass
class VAEConfig:
    """CogVideoX 3-D VAE; the latent scale factor always comes from the model's own config."""

    path: str = ""
    block_out_channels: List[int] = field(default_factory=lambda: [128, 256, 256, 512])
    layers_per_block: int = 3
    latent_channels: int = 16
    norm_num_groups: int = 32
    temporal_compression_ratio: int = 4
    scaling_factor: float = 1.15258426
    # Tiled decoding/encoding keeps 480x720 clips inside a 24 GB card; irrelevant for tiny sizes.
    tiling: bool = False
    # Let cuDNN time its 3-D convolution algorithms on the first decode of a shape and reuse the fastest
    # (the game decodes one fixed shape every turn). Not yet measured on a GPU: off by default.
    cudnn_benchmark: bool = False
    # Decoding options for play (benchmarks/game_turn_two_gpu.py measures speed and 8-bit difference):
    # the 3-D convolutions' weights channels_last_3d (cuDNN's NDHWC kernels), and torch.compile of the
    # VAE's decoder (fixed shapes; the first decode compiles).
    channels_last: bool = False
    compile: bool = False


@dataclass
class EncodersConfig:
    t5: T5Config = field(default_factory=T5Config)
    clip: ClipVisionConfig = field(default_factory=ClipVisionConfig)
    vae: VAEConfig = field(default_factory=VAEConfig)
    seed: int = 0  # seed of random-weight builds, so two processes build the same "random" model


PAPER_REP_WIDTH = 1920  # D: CogVideoX-2B's inner width (30 heads x 64), so the decoder needs no text_proj
PAPER_IMAGE_TOKENS = 196  # (224 / 16) ** 2 CLIP patches


@dataclass
class ActionEncoderConfig:
    """The action-aware encoder E(text, image) -> N x D (see docs/architecture.md, 'Networks')."""

    text_dim: int = 4096  # T5 width
    image_dim: int = 768  # CLIP width
    text_tokens: int = PAPER_TEXT_TOKENS
    image_tokens: int = PAPER_IMAGE_TOKENS
    width: int = PAPER_REP_WIDTH  # D
    fusion: str = "concat"  # concat | add | cross_attention (Table 3 ablations)
    mlp: bool = True  # False: one Linear per branch (the "less params" ablation)
    cross_attention_heads: int = 8
    layernorm_eps: float = 1e-5


@dataclass
class DecoderConfig:
    """CogVideoX-2B transformer with the motion-scope embedder and LoRA (see docs/architecture.md, 'Networks')."""

    path: str = ""  # local diffusers transformer folder (CogVideoX-2B); '' = random weights
    # The official release's decoder (SAT mp_rank_00_model_states.pt or its folder), loaded over the
    # base weights into encoder and decoder; its LoRA is kept as an adapter in a_joint, merged in a_warmup.
    official_checkpoint: str = ""
    num_layers: int = 30
    num_attention_heads: int = 30
    attention_head_dim: int = 64
    in_channels: int = 16
    out_channels: int = 16
    patch_size: int = 2
    time_embed_dim: int = 512
    sample_frames: int = 49  # diffusers' position-embedding grid: 49 frames -> 13 latent frames
    sample_height: int = 60
    sample_width: int = 90
    spatial_interpolation_scale: float = 1.875
    temporal_interpolation_scale: float = 1.0
    motion_scope: bool = True  # False: the "without motion scope" ablation
    lora_rank: int = 64
    lora_alpha: float = 1.0
    lora_targets: List[str] = field(default_factory=lambda: ["to_q", "to_k", "to_v", "to_out.0"])
    gradient_checkpointing: bool = False
    # With gradient_checkpointing: recompute every k-th block only (1 = every block, the most memory saved).
    gradient_checkpointing_every: int = 1
    # SDPA kernels on CUDA, in order of preference (unsupported ones are skipped for a shape):
    # cudnn | flash | efficient | math | fa4. cuDNN's fused attention is the fastest built-in kernel on
    # Hopper for the decoder's 64-wide heads and ~7k tokens; fa4 (FlashAttention-4 in SDPA's flash slot,
    # pip install '.[fa4]', Hopper or Blackwell, process-wide: models/attention_kernels.py) is faster
    # still (benchmarks/README.md, "Attention kernels"). PyTorch's default order varies by version and
    # GPU (flash first on older releases), so the order is fixed here.
    attention_backends: List[str] = field(default_factory=lambda: ["cudnn", "flash", "efficient", "math"])
    compile: bool = False  # torch.compile the transformer (first call compiles; fixed shapes)
    # torch.compile's mode with compile=true: default | max-autotune-no-cudagraphs (searches GEMM and
    # attention-adjacent kernel configs) | reduce-overhead / max-autotune (also CUDA graphs: sampling
    # only, the game and evaluation; every denoising step has the same shapes).
    compile_mode: str = "default"
    # FP8 matmuls for the frozen base linears of the blocks (models/fp8.py, torchao; CUDA >= 8.9):
    # off | tensorwise | rowwise. LoRA and every trained layer stay bf16.
    fp8: str = "off"
    # Play (the game, evaluation): the two guidance branches at once, the conditional one on a replica of
    # the decoder on a second GPU (diffusion/cfg_parallel.py). auto: when two CUDA devices are visible;
    # on: required (refused with fewer); off: one GPU, the branches as one batch of 2.
    cfg_parallel: str = "auto"


@dataclass
class DiffusionConfig:
    """Zero-terminal-SNR v-prediction DDPM of CogVideoX, and its sampler (see docs/architecture.md, 'Networks')."""

    num_train_timesteps: int = 1000
    beta_start: float = 0.00085
    beta_end: float = 0.012
    beta_schedule: str = "scaled_linear"
    snr_shift_scale: float = 3.0
    sampling_steps: int = 50
    guidance_scale: float = 6.0
    guidance_exponent: float = 5.0  # dynamic CFG
    # Sampling only, off by default: "first_block" skips the decoder's later blocks at steps whose first
    # block changed less than cache_threshold (diffusion/step_cache.py); the samples change.
    cache: str = "none"
    cache_threshold: float = 0.05


@dataclass
class MLLMConfig:
    """The game-state MLLM: Mistral-7B + LoRA + projections (see docs/architecture.md, 'Networks')."""

    path: str = ""  # local Mistral-7B-Instruct-v0.1 folder; '' = random weights at the sizes below
    # local tokenizer folder; '' = the LLM folder, or a byte tokenizer for random builds; 'words' = a
    # word-level tokenizer of the training instructions, for random builds (animegamer/mllm/words.py)
    tokenizer: str = ""
    official_checkpoint: str = ""  # the official release's MLLM pytorch_model.bin, loaded over the LLM
    vocab_size: int = 32000  # base vocabulary before the AnimeGamer tokens (random builds)
    hidden_size: int = 4096
    intermediate_size: int = 14336
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int = 8
    max_position_embeddings: int = 32768
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    sliding_window: int = 4096
    lora_rank: int = 32
    lora_alpha: float = 32.0
    lora_dropout: float = 0.05
    lora_targets: List[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    train_norms: bool = True  # RMSNorms trainable (peft modules_to_save in the official release)
    train_embeddings: bool = True  # input and output embedding matrices trainable
    # Every LLM weight trainable, beside LoRA: for random-weight presets, whose frozen base is no
    # pretrained model to adapt (docs/plans/known_answer.md); the paper freezes pretrained Mistral.
    train_base: bool = False
    lm_weight: float = 1.0
    rec_weight: float = 1.0  # MSE on the representation
    cos_weight: float = 0.0  # Table 3 ablation: cosine term on the representation
    attention: str = "sdpa"  # sdpa | flex | eager
    # SDPA kernels in order of preference, as model.decoder.attention_backends; attention=sdpa only
    # ([] = PyTorch's order, which picked cuDNN for phase (b) on an H200 with torch 2.11;
    # phase.pad_to_multiple keeps cuDNN's per-shape graphs few).
    attention_backends: List[str] = field(default_factory=list)
    # Inference: greedy over the state layout's allowed tokens only (never malformed). Off = the
    # official free greedy decoding, where a broken layout is an error with the generated text.
    constrained_states: bool = False
    gradient_checkpointing: bool = False
    gradient_checkpointing_every: int = 1  # as model.decoder.gradient_checkpointing_every
    # torch.compile each decoder layer (models/compiling.py: one graph for all 32 layers, dynamic
    # sequence length); the first steps compile.
    compile: bool = False


@dataclass
class ModelConfig:
    """The ``model/`` group: every network's sizes (tiny, paper). Phases add their networks here."""

    name: str = "paper"
    encoders: EncodersConfig = field(default_factory=EncodersConfig)
    encoder: ActionEncoderConfig = field(default_factory=ActionEncoderConfig)
    decoder: DecoderConfig = field(default_factory=DecoderConfig)
    diffusion: DiffusionConfig = field(default_factory=DiffusionConfig)
    mllm: MLLMConfig = field(default_factory=MLLMConfig)


# --------------------------------------------------------------------------- pipeline stages
@dataclass
class IngestConfig:
    extensions: List[str] = field(default_factory=lambda: [".mp4", ".mkv", ".avi", ".mov", ".webm", ".m4v", ".ogv"])
    min_side: int = 64  # smaller frames cannot give a meaningful 480x720 crop
    max_aspect: float = 4.0  # wider/taller than this is not film footage
    # Relative spread of frame-to-frame time deltas above which a file is variable frame rate.
    vfr_tolerance: float = 0.05


@dataclass
class ShotsConfig:
    detector: str = "content"  # content | adaptive
    threshold: float = 27.0  # ContentDetector
    adaptive_threshold: float = 3.0  # AdaptiveDetector
    min_content_val: float = 15.0  # AdaptiveDetector
    min_scene_frames: int = 8
    analysis_width: int = 256  # frames are decoded at this width for detection and flow


@dataclass
class ClipsConfig:
    fps: float = PAPER_CLIP_FPS
    frames: int = PAPER_CLIP_FRAMES
    height: int = PAPER_CLIP_HEIGHT
    width: int = PAPER_CLIP_WIDTH
    stride_seconds: float = 2.0  # distance between window starts inside a shot
    margin_frames: int = 2  # source frames kept away from a cut (fades, encoder smear)
    max_clips_per_shot: int = 0  # 0 = no limit
    # Constant quantiser, not CRF: x264's CRF rate control gave different bytes for the same frames
    # from run to run (measured), which would break byte-identical restarts.
    qp: int = 20
    codec: str = "libx264"


@dataclass
class MotionConfig:
    estimator: str = "farneback"  # farneback | raft
    raft_weights: str = ""  # local torchvision RAFT weights file, for estimator=raft
    threshold: float = 0.2  # pixels (in output-resolution units) below which flow counts as static
    analysis_width: int = 256  # flow resolution; magnitudes are rescaled to output pixels
    bins: str = "quantile"  # quantile | fixed
    # Inner edges between levels 1..5 (4 values), output-resolution pixels per output frame.
    fixed_edges: List[float] = field(default_factory=lambda: [0.5, 2.5, 10.0, 20.0])


@dataclass
class CaptionConfig:
    backend: str = "jsonl"  # jsonl | vlm | http | none
    path: str = ""  # jsonl: caption file, or a folder of <film_id>.jsonl
    model_path: str = ""  # vlm: local transformers image-text-to-text folder
    reference_images: str = ""  # optional folder of <character>.png reference images
    url: str = ""  # http: OpenAI-compatible base URL (http://host:port/v1)
    model_name: str = ""  # http: model name sent to the endpoint
    api_key_env: str = "OPENAI_API_KEY"  # http: env var holding the key (never in config files)
    num_frames: int = 4
    max_new_tokens: int = 256
    retries: int = 2
    timeout_s: float = 60.0  # http: per socket operation (connecting, each read)
    deadline_s: float = 180.0  # http: per request, the answer's body included
    # http: seconds one worker process may spend on requests; 0 = no limit (a run's request time grows
    # with its films). Once spent, the clips left fail at once with that reason.
    budget_s: float = 0.0
    trust_remote_code: bool = False
    # http: a run again asks once more for the clips whose caption failed (a server's failures can
    # pass), keeping their clips; false keeps the failures until a caption setting changes.
    retry_failed: bool = True
    # A run stops (exit 2, after writing what it did) when fewer of its clips than this share are
    # captioned; 0 = never (backend none never stops).
    min_captioned_share: float = 0.05
    # http, before any work: "models" (GET {url}/models: the server answers, takes the key and serves
    # the path; no tokens spent), "connect" (a TCP connection only, for servers without /models), "off".
    probe: str = "models"
    probe_timeout_s: float = 5.0  # http: bounds the probe (connecting and the answer)


@dataclass
class WriterConfig:
    maxcount: int = 1000  # clips per shard
    report_histogram: bool = True


@dataclass
class PrecomputeConfig:
    enabled: bool = True
    batch_size: int = 4
    device: str = "cpu"
    dtype: str = "float32"  # float32 | bfloat16 | float16


@dataclass
class SessionsConfig:
    turns: int = 5  # K consecutive clips per session
    stride: int = 1


@dataclass
class RepresentationsConfig:
    """The representation step: a trained phase (a) encoder over the feature shards (see
    docs/architecture.md, 'Representation shards')."""

    export: str = ""  # phase (a) export folder; the step runs only when this is set
    dtype: str = "float16"
    batch_size: int = 16
    device: str = "cpu"


@dataclass
class AdaptationDataConfig:
    """The adaptation step: a trained phase (b) model predicts each clip's rep with true history."""

    export: str = ""  # phase (b) export folder; the step runs only when this is set
    batch_size: int = 8
    device: str = "cpu"


@dataclass
class PipelineConfig:
    inputs: List[str] = field(default_factory=list)  # files, folders or globs
    output: str = "outputs/pipeline"
    # Which steps to run: process (per film, parallel), finalize (bins, shards, report),
    # precompute (features), sessions (index). Empty = all.
    steps: List[str] = field(default_factory=list)
    workers: int = 1
    part: int = 0  # this machine's part when the inputs are split over num_parts machines
    num_parts: int = 1
    shots_per_task: int = 8  # long films are cut into tasks of this many shots
    toy_film: bool = False  # generate the toy film into the output folder and use it as input
    # A run into an output folder another run holds waits this long for it, then stops (utils/folder_lock.py).
    lock_wait_seconds: float = 0.0
    ingest: IngestConfig = field(default_factory=IngestConfig)
    shots: ShotsConfig = field(default_factory=ShotsConfig)
    clips: ClipsConfig = field(default_factory=ClipsConfig)
    motion: MotionConfig = field(default_factory=MotionConfig)
    caption: CaptionConfig = field(default_factory=CaptionConfig)
    writer: WriterConfig = field(default_factory=WriterConfig)
    precompute: PrecomputeConfig = field(default_factory=PrecomputeConfig)
    sessions: SessionsConfig = field(default_factory=SessionsConfig)
    representations: RepresentationsConfig = field(default_factory=RepresentationsConfig)
    adaptation: AdaptationDataConfig = field(default_factory=AdaptationDataConfig)


# --------------------------------------------------------------------------- training
@dataclass
class PhaseConfig:
    """The ``phase/`` group's fields common to every phase: its name, the optimiser and schedule, the
    batch, where it starts from, validation. Each phase's own fields are in its subclass below, and
    each ``configs/phase/*.yaml`` defaults to its phase's schema, so a field that means nothing in a
    phase (``phase.pack_tokens`` in phase (a)) is rejected when the config is composed. The names and
    what each phase is: ``animegamer.phases.specs``."""

    name: str = MISSING  # set by each configs/phase/*.yaml
    max_steps: int = 80_000
    lr: float = 2e-4
    warmup_steps: int = 1000
    lr_schedule: str = CONSTANT_SCHEDULE  # constant | cosine (after warm-up)
    min_lr_ratio: float = 0.1  # cosine floor, as a fraction of lr
    weight_decay: float = 1e-4
    betas: List[float] = field(default_factory=lambda: [0.9, 0.95])
    eps: float = 1e-8
    grad_clip: float = 1.0
    batch_size: int = 1  # per device
    init_from: str = ""  # export folder of an earlier stage/phase to start from (a_joint <- a_warmup)
    val_every_n_steps: int = 1000
    val_clips: int = 2  # clips decoded and logged at each validation
    val_sampling_steps: int = 0  # 0 = model.diffusion.sampling_steps


@dataclass
class PhaseAConfig(PhaseConfig):
    """Phase (a), both stages: the encoder and decoder reconstruct clips from (text, first frame)."""

    text_dropout: float = 0.05  # CFG dropout of the text branch
    image_dropout: float = 0.05  # CFG dropout of the image branch
    random_frame: bool = False  # Table 3 ablation: condition on a random frame, not the first
    input: str = "features"  # features (precomputed) | clips (frozen encoders run in the step)


@dataclass
class PhaseBConfig(PhaseConfig):
    """Phase (b): the game-state MLLM learns the next turn from windows of a session."""

    # Pack the batch's sequences into rows of at most this many tokens instead of padding each to the
    # longest (0 = pad). Same losses; fewer padded tokens (mllm.packing). Rows are then rounded up by
    # pad_to_multiple.
    pack_tokens: int = 0
    # Round each batch's length up to a multiple of this (0 = the longest sequence). cuDNN's attention
    # builds (compiles) a graph per new shape, ~0.4 s each; windows of 1..5 turns give a new length
    # nearly every step, so unrounded lengths cost a rebuild per step. 64 bounds the shapes to ~25 and
    # pads ~4 % of the tokens.
    pad_to_multiple: int = 64
    # The frozen LLM weights held in bfloat16 while the trained ones (LoRA, norms, embeddings, projections)
    # stay float32: with trainer.precision=bf16-mixed on one device or DDP, where the base is otherwise
    # float32 under autocast. Same results (autocast rounds each weight to bf16 exactly as the cast does),
    # half the base's memory, no per-matmul weight casts (paper size, one H200: 3.6 % faster per step).
    # DeepSpeed's bf16 mode already holds every weight in bf16; FSDP needs one dtype per sharded unit.
    # null (default): on wherever it applies; true: required (refused where it does not apply); false: off.
    frozen_bf16: Optional[bool] = None


@dataclass
class PhaseCConfig(PhaseConfig):
    """Phase (c): the decoder adapts to the MLLM's predicted representations."""

    # Probability that a sample's predicted representation is replaced by the unconditional one (the
    # encoder on zeroed text and image), so the decoder keeps learning the CFG branch.
    unconditional_rep_prob: float = 0.05


@dataclass
class TrainDataConfig:
    """Where a phase reads its shards: the pipeline's output folder and its sub-folders."""

    root: str = "outputs/pipeline"
    clips: str = "clips"
    features: str = "features"
    representations: str = "representations"
    sessions: str = "session_shards"
    adaptation: str = "adaptation"
    # Phase (b): relative weight of each window length 1..K (paper: equal for 1..5 turns).
    window_weights: List[float] = field(default_factory=lambda: [1.0, 1.0, 1.0, 1.0, 1.0])
    val_fraction: float = 0.1  # held-out clips (by key hash), never trained on
    num_workers: int = 0
    # Corrupt samples or shards skipped (and logged) before training stops with an error.
    bad_sample_budget: int = 100
    # data.root (or a sub-folder) as a URL (s3://, gs://, https://): a failed request is sent again this
    # many times, with a back-off, before the run stops naming the URL; each request's time limit.
    remote_retries: int = DEFAULT_RETRIES
    remote_timeout_s: float = DEFAULT_TIMEOUT_S


@dataclass
class TrainerConfig:
    """The ``trainer/`` group: Lightning Trainer settings; distribution is configuration only."""

    accelerator: str = "cpu"
    devices: int = 1
    num_nodes: int = 1
    strategy: str = "auto"
    precision: str = "32-true"
    accumulate_grad_batches: int = 1
    log_every_n_steps: int = 10
    deterministic: bool = False
    benchmark: bool = False
    # Dense bf16 peak of one device in TFLOP/s for the logged MFU (0 = do not log MFU); measure it on
    # your GPU (benchmarks/ print it) rather than trusting a datasheet.
    peak_tflops: float = 0.0
    throughput_every_n_steps: int = 10
    # Steps in a row whose gradient norm may be NaN/inf (each one skipped) before the run stops.
    max_nonfinite_in_row: int = 3
    # Signals that save a checkpoint at the end of the current optimizer step, then exit (preemption; a
    # second SIGINT, Ctrl-C pressed again, stops at once).
    preemption_signals: list[str] = field(default_factory=lambda: ["SIGTERM", "SIGUSR1", "SIGINT"])
    # strategy=fsdp only: FULL_SHARD (least memory: weights re-gathered for the backward) or
    # SHARD_GRAD_OP (weights gathered once per step and kept through the backward: less traffic,
    # ZeRO-2's trade); HYBRID_SHARD shards within a node and replicates across nodes.
    fsdp_sharding: str = "FULL_SHARD"
    # strategy=fsdp, precision=bf16-mixed only: "autocast" (Lightning's bf16-mixed: float32 weights,
    # autocast) or "bf16" (FSDP MixedPrecision: bf16 weights and activations in compute as DeepSpeed's
    # bf16 mode, float32 master weights and gradient reduction, no autocast and its float32 copies).
    fsdp_compute: str = "autocast"
    # strategy=fsdp only: where each rank builds the model before FSDP shards it. "cpu" (Lightning's
    # way: fits any model, slow for 7B) or "gpu" (the whole model on each GPU first, float32 under
    # bf16-mixed, as the other strategies build; needs it to fit). training/strategies.module_init.
    fsdp_init_device: str = "cpu"
    # '' | simple | advanced | pytorch (training/profiling.py): a trace of where the step time goes.
    profiler: str = ""
    profile_skip_steps: int = 10
    profile_active_steps: int = 3
    # Count the host's waits for the GPU by line of code (training/sync_sites.py; CUDA only, slows the
    # steps it counts): <output>/sync_sites.json.
    sync_debug: bool = False


@dataclass
class LoggerConfig:
    """The ``logger/`` group: wandb (offline by default), tensorboard, csv or none."""

    kind: str = "csv"  # wandb | tensorboard | csv | none
    project: str = "animegamer"
    offline: bool = True


@dataclass
class CheckpointConfig:
    every_n_steps: int = 1000
    keep_last: int = 3


@dataclass
class JudgeConfig:
    """``evaluation.judge``: the MLLM judge of Table 2, any OpenAI-compatible chat endpoint with image input
    (a hosted model, or a local server such as vLLM serving an open VLM)."""

    url: str = ""  # base URL, e.g. http://127.0.0.1:8000/v1; '' -> the judge's scores are reported unavailable
    model_name: str = ""  # the model name sent to the endpoint (and shown in the report)
    api_key_env: str = "OPENAI_API_KEY"  # the environment variable holding the key (never the key itself)
    samples: int = 3  # independent judgements per game: the report gives their mean and spread
    frames_per_turn: int = 4  # evenly spaced frames of each turn's clip, first and last included
    image_max_side: int = 448  # frames are scaled down to this longest side before sending
    temperature: float = 0.7  # > 0: the samples are independent draws of the judge
    max_tokens: int = 300
    retries: int = 2  # per sample: a malformed answer or a failed request is asked again this many times
    timeout_s: float = 120.0  # per socket operation (connecting, each read)
    deadline_s: float = 300.0  # per request, the answer's body included
    # all the run's requests; 0 = no limit. Once spent, the games left are reported unscored.
    budget_s: float = 3600.0


@dataclass
class EvalConfig:
    """``evaluate.py``: benchmark games, the trained game to play, and the metric models."""

    mllm_export: str = ""  # phase (b) export
    renderer_export: str = ""  # phase (c) export; a phase (a) export = the "without adaptation" setting
    benchmark: str = ""  # benchmark file (json); '' = built from held-out sessions and written to out
    games: int = 4
    turns: int = 5
    # games played at once (MLLM, sampler and VAE batched over them; the same results as one at a time)
    batch_games: int = 1
    clip_model: str = ""  # local CLIP folder for CLIP-I / CLIP-T; '' -> reported unavailable
    dreamsim: str = ""  # local DreamSim weights folder; '' -> reported unavailable
    reconstruction_export: str = ""  # phase (a) export: also the Table 3 reconstruction metrics
    reconstruction_clips: int = 8
    # With reconstruction_export: also decode each reconstructed clip at every level's flow value (its
    # representation and noise fixed) and score how the measured speed follows the requested one
    # (metrics/motion_sweep.py). Five more samplings per clip, so off unless asked for.
    motion_sweep: bool = False
    sampling_steps: int = 0  # 0 = model.diffusion.sampling_steps
    # Also play the benchmark with the MLLM as phase (b) started (its export's seed and init_from, no
    # trained weights) and the same renderer: the "untrained game" baseline row.
    untrained_game: bool = False
    out: str = "outputs/eval"
    judge: JudgeConfig = field(default_factory=JudgeConfig)


@dataclass
class CommandConfig:
    """What every command reads: the networks' sizes, the seed and the log level."""

    model: ModelConfig = field(default_factory=ModelConfig)
    seed: int = 0
    log_level: str = "INFO"


@dataclass
class PipelineRunConfig(CommandConfig):
    """Root of ``animegamer pipeline`` (``configs/pipeline.yaml``): the films' processing, with the frozen
    encoders its feature steps run and the sizes of the exports its later steps read."""

    pipeline: PipelineConfig = field(default_factory=PipelineConfig)


@dataclass
class EvalRunConfig(CommandConfig):
    """Root of ``animegamer eval`` (``configs/evaluate.yaml``): the game evaluated, the held-out data it plays
    (``data.*``, and the pipeline settings it was made with: its clip size and motion levels), the metrics."""

    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    data: TrainDataConfig = field(default_factory=TrainDataConfig)
    evaluation: EvalConfig = field(default_factory=EvalConfig)


@dataclass
class RunConfig(CommandConfig):
    """Root of ``animegamer train`` (``configs/train.yaml``): one phase's run. ``pipeline.*`` are the settings
    of the shards it trains on (their clip size, their folder), recorded with the run."""

    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    phase: PhaseConfig = field(default_factory=PhaseConfig)
    data: TrainDataConfig = field(default_factory=TrainDataConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    output_dir: str = "outputs/train"
    # Resume a run folder whose recorded config differs in settings that change the training
    # (training/run_record.py); the change is recorded in <output_dir>/run_config.json.
    resume_with_changes: bool = False
    # A start into a run folder another run holds waits this long for it to end, then stops naming it
    # (utils/folder_lock.py); e.g. 120 for a requeued SLURM job whose previous attempt may still be exiting.
    lock_wait_seconds: float = 0.0


RANKING_PORT = 8765  # the ranking page's port on 127.0.0.1
# A request to the ranking page (its line, headers and body) that stalls longer is dropped.
RANKING_REQUEST_TIMEOUT_S = 30.0


@dataclass
class RankingConfig:
    """``ranking``: the blind ranking page over evaluated runs, and its report (docs/game-and-evaluation.md)."""

    runs: List[str] = field(default_factory=list)  # 2 to 4 evaluation folders (each run's evaluation.out)
    names: List[str] = field(default_factory=list)  # a name per run for the report ([] = the folder names)
    out: str = ""  # folder of the answers and the report
    port: int = RANKING_PORT  # 0: any free port
    request_timeout_s: float = RANKING_REQUEST_TIMEOUT_S
    report_only: bool = False  # write the report from the answers and exit


@dataclass
class RankRunConfig:
    """Root of ``animegamer rank`` (``configs/rank.yaml``)."""

    ranking: RankingConfig = field(default_factory=RankingConfig)


@dataclass(frozen=True)
class Command:
    """A command over a root config: its verb (``animegamer <verb>``), the folder of its own config groups
    (``configs/<folder>/experiment/``, on its search path) and its root schema."""

    verb: str
    folder: str
    schema: type


# configs/<root>.yaml -> its command; each root's defaults list starts with <root>_schema (SCHEMA_SUFFIX).
COMMANDS = {"pipeline": Command("pipeline", "pipeline", PipelineRunConfig),
            "train": Command("train", "train", RunConfig),
            "evaluate": Command("eval", "eval", EvalRunConfig),
            "rank": Command("rank", "rank", RankRunConfig)}
SCHEMA_SUFFIX = "_schema"


# configs/phase/<name>.yaml -> the schema it defaults to (its ``defaults`` list names it).
PHASE_SCHEMAS = {"phase_a_schema": PhaseAConfig, "phase_b_schema": PhaseBConfig, "phase_c_schema": PhaseCConfig}


def register_configs() -> None:
    """Register every schema in Hydra's ConfigStore, once per store: every composition asks for them, and
    storing converts each dataclass into a config again, which costs more than the composition's own work.
    A store that lacks them (a new process, a store reset since) gets them; so tests and entry points may
    both call it."""
    cs = ConfigStore.instance()
    if all(f"{root}{SCHEMA_SUFFIX}.yaml" in cs.repo for root in COMMANDS) and \
            all(f"{name}.yaml" in cs.repo.get("phase", {}) for name in PHASE_SCHEMAS):
        return
    for root, command in COMMANDS.items():
        cs.store(name=f"{root}{SCHEMA_SUFFIX}", node=command.schema)
    cs.store(group="model", name="model_schema", node=ModelConfig)
    for name, node in PHASE_SCHEMAS.items():
        cs.store(group="phase", name=name, node=node)
    cs.store(group="trainer", name="trainer_schema", node=TrainerConfig)
    cs.store(group="logger", name="logger_schema", node=LoggerConfig)
