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

    # Local T5 v1.1 folder, or a diffusers pipeline folder with text_encoder/ (and tokenizer/); '' = random weights at
    # the sizes below with a byte tokenizer.
    path: str = ""
    d_model: int = 4096  # hidden width (T5 v1.1 XXL: 4096); checked against the folder's config.json
    d_kv: int = 64  # width of each attention head; checked against the folder
    d_ff: int = 10240  # feed-forward width (random builds; a loaded folder keeps its own)
    num_layers: int = 24  # encoder blocks (random builds)
    num_heads: int = 64  # attention heads; checked against the folder
    vocab_size: int = 32128  # embedding rows of a random build (its byte tokenizer needs at least 384)
    # Tokens per motion text, padded or truncated to exactly this many (= model.encoder.text_tokens).
    max_tokens: int = PAPER_TEXT_TOKENS
    # CogVideoX (diffusers and the official SAT code) run T5 without an attention mask, so the
    # pretrained decoder saw padding positions computed that way; keep it off to match them.
    attention_mask: bool = False


@dataclass
class ClipVisionConfig:
    """CLIP ViT vision tower (penultimate-layer patch tokens, CLS dropped)."""

    # Local CLIP folder (vision tower or full CLIPModel), or a pipeline folder with image_encoder/; '' = random weights
    # at the sizes below.
    path: str = ""
    hidden_size: int = 768  # width of the patch tokens (ViT-B/16: 768); checked against the folder's config.json
    intermediate_size: int = 3072  # MLP width (random builds; a loaded folder keeps its own)
    num_hidden_layers: int = 12  # transformer layers (random builds)
    num_attention_heads: int = 12  # attention heads (random builds)
    image_size: int = 224  # side in pixels the first frame is resized and center-cropped to; checked against the folder
    patch_size: int = 16  # patch side in pixels: (image_size / patch_size)^2 image tokens; checked against the folder


@dataclass
class VAEConfig:
    """CogVideoX 3-D VAE; the latent scale factor always comes from the model's own config."""

    path: str = ""  # local CogVideoX VAE folder, or a pipeline folder with vae/; '' = random weights at the sizes below
    # Channels of each block; n blocks compress height and width by 2^(n-1); checked against the folder.
    block_out_channels: List[int] = field(default_factory=lambda: [128, 256, 256, 512])
    layers_per_block: int = 3  # ResNet layers per block (random builds)
    latent_channels: int = 16  # channels of a latent (= model.decoder.in_channels); checked against the folder
    norm_num_groups: int = 32  # GroupNorm groups (random builds)
    # Time compression: T frames give (T - 1) / ratio + 1 latent frames; checked against the folder.
    temporal_compression_ratio: int = 4
    scaling_factor: float = 1.15258426  # latent scale of a random build; a loaded folder's own value is always used
    # Tiled decoding/encoding keeps 480x720 clips inside a 24 GB card; irrelevant for tiny sizes.
    tiling: bool = False
    # Let cuDNN time its 3-D convolution algorithms on the first decode of a shape and reuse the fastest
    # (the game decodes one fixed shape every turn). Not yet measured on a GPU: off by default.
    cudnn_benchmark: bool = False
    # Decoding options for play (benchmarks/game_turn_two_gpu.py measures speed and 8-bit difference):
    # the 3-D convolutions' weights channels_last_3d (cuDNN's NDHWC kernels), and torch.compile of the
    # VAE's decoder (fixed shapes; the first decode compiles).
    channels_last: bool = False
    compile: bool = False  # torch.compile the VAE's decoder in place (fixed shapes; the first decode compiles)


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
    text_tokens: int = PAPER_TEXT_TOKENS  # T5 tokens per motion text (= model.encoders.t5.max_tokens)
    # CLIP patch tokens of the first frame (= (clip.image_size / clip.patch_size)^2).
    image_tokens: int = PAPER_IMAGE_TOKENS
    width: int = PAPER_REP_WIDTH  # D
    fusion: str = "concat"  # concat | add | cross_attention (Table 3 ablations)
    mlp: bool = True  # False: one Linear per branch (the "less params" ablation)
    # Heads of the image-to-text attention (fusion=cross_attention only; must divide width).
    cross_attention_heads: int = 8
    layernorm_eps: float = 1e-5  # epsilon of each branch's LayerNorm


@dataclass
class DecoderConfig:
    """CogVideoX-2B transformer with the motion-scope embedder and LoRA (see docs/architecture.md, 'Networks')."""

    path: str = ""  # local diffusers transformer folder (CogVideoX-2B); '' = random weights
    # The official release's decoder (SAT mp_rank_00_model_states.pt or its folder), loaded over the
    # base weights into encoder and decoder; its LoRA is kept as an adapter in a_joint, merged in a_warmup.
    official_checkpoint: str = ""
    num_layers: int = 30  # transformer blocks (CogVideoX-2B: 30); checked against the folder's config.json
    # Attention heads; heads x attention_head_dim is the hidden width (= model.encoder.width); checked against the
    # folder, as the sizes down to time_embed_dim.
    num_attention_heads: int = 30
    attention_head_dim: int = 64  # width of each attention head
    in_channels: int = 16  # latent channels in (= model.encoders.vae.latent_channels)
    out_channels: int = 16  # channels of the predicted velocity (the latent channels)
    patch_size: int = 2  # side of the square latent patches that become tokens (2: 2x2 latent pixels)
    time_embed_dim: int = 512  # width of the timestep embedding (the motion-scope embedding is added to it)
    sample_frames: int = 49  # diffusers' position-embedding grid: 49 frames -> 13 latent frames
    # Latent height of the precomputed position-embedding grid (480 / 8); other sizes compute theirs.
    sample_height: int = 60
    sample_width: int = 90  # latent width of that grid (720 / 8)
    # Spatial positions of the 3-D sin-cos embedding are divided by this (CogVideoX-2B: 1.875).
    spatial_interpolation_scale: float = 1.875
    temporal_interpolation_scale: float = 1.0  # latent-frame positions of that embedding are divided by this
    motion_scope: bool = True  # False: the "without motion scope" ablation
    lora_rank: int = 64  # rank of the decoder's LoRA (trained in phase a_joint and phase (c))
    lora_alpha: float = 1.0  # LoRA scaling: the update is lora_alpha / lora_rank x B A
    # Attention linears of each block that get LoRA (peft target_modules).
    lora_targets: List[str] = field(default_factory=lambda: ["to_q", "to_k", "to_v", "to_out.0"])
    # Recompute the blocks' activations in the backward pass: less memory, more compute.
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

    num_train_timesteps: int = 1000  # timesteps of the training schedule (CogVideoX: 1000)
    beta_start: float = 0.00085  # beta at the first timestep, before the SNR shift and the zero-terminal-SNR rescale
    beta_end: float = 0.012  # beta at the last timestep, before the SNR shift and the rescale
    # diffusers' beta_schedule name (CogVideoX: scaled_linear); keep the pretrained decoder's schedule.
    beta_schedule: str = "scaled_linear"
    snr_shift_scale: float = 3.0  # s of the SNR shift alpha_bar / (s + (1 - s) alpha_bar) (CogVideoX-2B: 3)
    sampling_steps: int = 50  # DPM++ steps per sampled clip; a divisor of num_train_timesteps keeps every step exact
    # Classifier-free guidance s: each step's weight lies in 1 .. 1 + s; <= 1: the conditional branch alone.
    guidance_scale: float = 6.0
    guidance_exponent: float = 5.0  # dynamic CFG
    # Sampling only, off by default: "first_block" skips the decoder's later blocks at steps whose first
    # block changed less than cache_threshold (diffusion/step_cache.py); the samples change.
    cache: str = "none"
    # cache=first_block: relative change of the first block's residual below which a step skips the rest (higher skips
    # more).
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
    hidden_size: int = 4096  # LLM width (Mistral-7B: 4096); checked against the folder's config.json
    intermediate_size: int = 14336  # MLP width; checked against the folder
    num_hidden_layers: int = 32  # decoder layers; checked against the folder
    num_attention_heads: int = 32  # query heads; checked against the folder
    num_key_value_heads: int = 8  # key/value heads (grouped-query attention); checked against the folder
    # Longest sequence of a random build (a loaded folder keeps its own, as for the three below).
    max_position_embeddings: int = 32768
    rms_norm_eps: float = 1e-5  # RMSNorm epsilon (random builds)
    rope_theta: float = 10000.0  # RoPE base frequency (random builds)
    sliding_window: int = 4096  # attention window in tokens (random builds)
    lora_rank: int = 32  # rank of the LLM's LoRA (trained in phase (b))
    lora_alpha: float = 32.0  # LoRA scaling: the update is lora_alpha / lora_rank x B A
    lora_dropout: float = 0.05  # dropout on the LoRA branch's input while training
    # Mistral's linears that get LoRA (peft target_modules): attention and MLP projections.
    lora_targets: List[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    train_norms: bool = True  # RMSNorms trainable (peft modules_to_save in the official release)
    train_embeddings: bool = True  # input and output embedding matrices trainable
    # Every LLM weight trainable, beside LoRA: for random-weight presets, whose frozen base is no
    # pretrained model to adapt (docs/plans/known_answer.md); the paper freezes pretrained Mistral.
    train_base: bool = False
    lm_weight: float = 1.0  # weight of the cross-entropy on the target turn's state tokens
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
    # Recompute the decoder layers' activations in the backward pass: less memory, more compute.
    gradient_checkpointing: bool = False
    gradient_checkpointing_every: int = 1  # as model.decoder.gradient_checkpointing_every
    # torch.compile each decoder layer (models/compiling.py: one graph for all 32 layers, dynamic
    # sequence length); the first steps compile.
    compile: bool = False


@dataclass
class ModelConfig:
    """The ``model/`` group: every network's sizes (tiny, paper). Phases add their networks here."""

    # The preset's name (tiny | small | paper, set by configs/model/*.yaml), recorded in game records and reports.
    name: str = "paper"
    encoders: EncodersConfig = field(default_factory=EncodersConfig)
    encoder: ActionEncoderConfig = field(default_factory=ActionEncoderConfig)
    decoder: DecoderConfig = field(default_factory=DecoderConfig)
    diffusion: DiffusionConfig = field(default_factory=DiffusionConfig)
    mllm: MLLMConfig = field(default_factory=MLLMConfig)


# --------------------------------------------------------------------------- pipeline stages
@dataclass
class IngestConfig:
    # Suffixes of the videos found in an input folder (any case); a file named directly or by a glob is read whatever
    # its suffix.
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
    min_scene_frames: int = 8  # fewest source frames between two cuts (PySceneDetect's min_scene_len)
    analysis_width: int = 256  # frames are decoded at this width for detection and flow


@dataclass
class ClipsConfig:
    fps: float = PAPER_CLIP_FPS  # frame rate of a clip: source frames are sampled at this rate
    frames: int = PAPER_CLIP_FRAMES  # frames per clip (17 at 8 fps span 2 s)
    # Clip height in pixels (frames are resized to cover the clip size, then center-cropped).
    height: int = PAPER_CLIP_HEIGHT
    width: int = PAPER_CLIP_WIDTH  # clip width in pixels
    stride_seconds: float = 2.0  # distance between window starts inside a shot
    margin_frames: int = 2  # source frames kept away from a cut (fades, encoder smear)
    max_clips_per_shot: int = 0  # 0 = no limit
    # Constant quantiser, not CRF: x264's CRF rate control gave different bytes for the same frames
    # from run to run (measured), which would break byte-identical restarts.
    qp: int = 20
    # FFmpeg encoder of the clips' mp4 (through PyAV); qp and the preset are passed as x264 options.
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
    num_frames: int = 4  # vlm, http: evenly spaced frames of each clip shown to the model
    max_new_tokens: int = 256  # vlm, http: most tokens the model may generate per answer
    retries: int = 2  # vlm, http: a clip is asked again this many times after a failed request or an unparsable answer
    timeout_s: float = 60.0  # http: per socket operation (connecting, each read)
    deadline_s: float = 180.0  # http: per request, the answer's body included
    # http: seconds one worker process may spend on requests; 0 = no limit (a run's request time grows
    # with its films). Once spent, the clips left fail at once with that reason.
    budget_s: float = 0.0
    # vlm: let transformers run Python code shipped in the model folder (some VLMs need it).
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
    # The finalize step also draws motion_levels.png in the output folder (clips per level, flow histogram).
    report_histogram: bool = True


@dataclass
class PrecomputeConfig:
    # Run the precompute step: frozen T5, CLIP and VAE features of each captioned clip (phase.input=features).
    enabled: bool = True
    batch_size: int = 4  # clips per batch through the frozen encoders
    device: str = "cpu"  # torch device of the frozen encoders (cpu, cuda, cuda:1)
    dtype: str = "float32"  # float32 | bfloat16 | float16


@dataclass
class SessionsConfig:
    turns: int = 5  # K consecutive clips per session
    # A session starts every this many clips along a run of captioned clips (1: overlapping; = turns: disjoint).
    stride: int = 1


@dataclass
class RepresentationsConfig:
    """The representation step: a trained phase (a) encoder over the feature shards (see
    docs/architecture.md, 'Representation shards')."""

    export: str = ""  # phase (a) export folder; the step runs only when this is set
    # float16 | bfloat16 | float32: how the representations are stored (bfloat16 as float32: numpy has none).
    dtype: str = "float16"
    batch_size: int = 16  # clips per batch through the encoder
    device: str = "cpu"  # torch device of the encoder (cpu, cuda, cuda:1)


@dataclass
class AdaptationDataConfig:
    """The adaptation step: a trained phase (b) model predicts each clip's rep with true history."""

    export: str = ""  # phase (b) export folder; the step runs only when this is set
    batch_size: int = 8  # clips predicted per batch by the MLLM
    device: str = "cpu"  # torch device of the MLLM (cpu, cuda, cuda:1)


@dataclass
class PipelineConfig:
    inputs: List[str] = field(default_factory=list)  # files, folders or globs
    # Folder of everything the pipeline writes (staged work, shards, report.json); a run again reuses what is done.
    output: str = "outputs/pipeline"
    # Which steps to run: process (per film, parallel), finalize (bins, shards, report),
    # precompute (features), sessions (index). Empty = all.
    steps: List[str] = field(default_factory=list)
    workers: int = 1  # processes for the per-film work (shot plans, clip tasks); 1 = this process
    part: int = 0  # this machine's part when the inputs are split over num_parts machines
    # Machines the inputs are split over (round-robin over the sorted files), each running its own part.
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
    max_steps: int = 80_000  # optimizer steps to train; a resumed run trains up to the same count
    lr: float = 2e-4  # AdamW's peak learning rate (reached after warm-up)
    warmup_steps: int = 1000  # optimizer steps of linear warm-up from lr / warmup_steps to lr
    lr_schedule: str = CONSTANT_SCHEDULE  # constant | cosine (after warm-up)
    min_lr_ratio: float = 0.1  # cosine floor, as a fraction of lr
    weight_decay: float = 1e-4  # AdamW's decoupled weight decay on matrices; 1-D parameters (biases, norms) get none
    betas: List[float] = field(default_factory=lambda: [0.9, 0.95])  # AdamW's (beta1, beta2)
    eps: float = 1e-8  # AdamW's epsilon
    grad_clip: float = 1.0  # the gradients' global L2 norm is clipped to this; 0 = no clipping
    batch_size: int = 1  # per device
    init_from: str = ""  # export folder of an earlier stage/phase to start from (a_joint <- a_warmup)
    # Held-out validation every this many training batches (Lightning's val_check_interval).
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

    # The pipeline's output folder (train.yaml and evaluate.yaml set ${pipeline.output}) or a URL (s3://, gs://,
    # https://).
    root: str = "outputs/pipeline"
    # Sub-folder of the clip shards (phase.input=clips, the held-out split, evaluation); an absolute path or URL
    # replaces data.root, as for the sub-folders below.
    clips: str = "clips"
    features: str = "features"  # sub-folder of the feature shards phase (a) reads with phase.input=features
    # Sub-folder of the representation shards; no phase reads it (the session shards carry the representations).
    representations: str = "representations"
    sessions: str = "session_shards"  # sub-folder of the session shards phase (b) reads
    adaptation: str = "adaptation"  # sub-folder of the adaptation shards phase (c) reads
    # Phase (b): relative weight of each window length 1..K (paper: equal for 1..5 turns).
    window_weights: List[float] = field(default_factory=lambda: [1.0, 1.0, 1.0, 1.0, 1.0])
    val_fraction: float = 0.1  # held-out clips (by key hash), never trained on
    num_workers: int = 0  # DataLoader worker processes per training process; 0 = load in the main process
    # Corrupt samples or shards skipped (and logged) before training stops with an error.
    bad_sample_budget: int = 100
    # data.root (or a sub-folder) as a URL (s3://, gs://, https://): a failed request is sent again this
    # many times, with a back-off, before the run stops naming the URL; each request's time limit.
    remote_retries: int = DEFAULT_RETRIES
    remote_timeout_s: float = DEFAULT_TIMEOUT_S  # seconds each request to a URL may take


@dataclass
class TrainerConfig:
    """The ``trainer/`` group: Lightning Trainer settings; distribution is configuration only."""

    accelerator: str = "cpu"  # cpu | gpu (or cuda): Lightning's accelerator
    devices: int = 1  # devices per node, one process each; -1 = every visible GPU
    num_nodes: int = 1  # machines the run spans
    # auto | ddp | ddp_spawn | fsdp | deepspeed_stage_1 | deepspeed_stage_2(_offload) | deepspeed_stage_3(_offload).
    strategy: str = "auto"
    # Lightning's precision name: 32-true (the cpu preset), bf16-mixed (the gpu presets: bf16 autocast, float32
    # weights) or another Lightning knows.
    precision: str = "32-true"
    # Batches per optimizer step: samples per step = phase.batch_size x this x devices x num_nodes.
    accumulate_grad_batches: int = 1
    log_every_n_steps: int = 10  # metrics go to the logger every this many optimizer steps
    # Lightning's deterministic: deterministic torch algorithms only (slower; an op without one raises).
    deterministic: bool = False
    # Lightning's benchmark (torch.backends.cudnn.benchmark): cuDNN times its algorithms for each new input shape
    # and keeps the fastest.
    benchmark: bool = False
    # Dense bf16 peak of one device in TFLOP/s for the logged MFU (0 = do not log MFU); measure it on
    # your GPU (benchmarks/ print it) rather than trusting a datasheet.
    peak_tflops: float = 0.0
    # perf/* (samples/s, tokens/s, MFU, data wait) logged every this many optimizer steps, averaged.
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
    profile_skip_steps: int = 10  # profiler=pytorch: optimizer steps before the recorded window (compilation, warm-up)
    profile_active_steps: int = 3  # profiler=pytorch: optimizer steps recorded in the trace
    # Count the host's waits for the GPU by line of code (training/sync_sites.py; CUDA only, slows the
    # steps it counts): <output>/sync_sites.json.
    sync_debug: bool = False


@dataclass
class LoggerConfig:
    """The ``logger/`` group: wandb (offline by default), tensorboard, csv or none."""

    kind: str = "csv"  # wandb | tensorboard | csv | none
    project: str = "animegamer"  # wandb only: the project (the run is named after output_dir's last folder)
    offline: bool = True  # wandb only: write the run locally, no network (`wandb sync` it later)


@dataclass
class CheckpointConfig:
    every_n_steps: int = 1000  # a checkpoint every this many optimizer steps (>= 1), in <output_dir>/checkpoints
    # Checkpoints kept after each save: the newest K; -1 = all; 0 = no periodic saves (final and preemption saves
    # remain).
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
    max_tokens: int = 300  # most tokens of each answer (the request's max_tokens)
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
    # Games built from held-out shots when benchmark is '' (longest first; fewer if the held-out data gives fewer).
    games: int = 4
    turns: int = 5  # turns of each built game at most (a run of held-out clips may give fewer)
    # games played at once (MLLM, sampler and VAE batched over them; the same results as one at a time)
    batch_games: int = 1
    clip_model: str = ""  # local CLIP folder for CLIP-I / CLIP-T; '' -> reported unavailable
    dreamsim: str = ""  # local DreamSim weights folder; '' -> reported unavailable
    reconstruction_export: str = ""  # phase (a) export: also the Table 3 reconstruction metrics
    reconstruction_clips: int = 8  # held-out clips reconstructed and scored with reconstruction_export (at most)
    # With reconstruction_export: also decode each reconstructed clip at every level's flow value (its
    # representation and noise fixed) and score how the measured speed follows the requested one
    # (metrics/motion_sweep.py). Five more samplings per clip, so off unless asked for.
    motion_sweep: bool = False
    sampling_steps: int = 0  # 0 = model.diffusion.sampling_steps
    # Also play the benchmark with the MLLM as phase (b) started (its export's seed and init_from, no
    # trained weights) and the same renderer: the "untrained game" baseline row.
    untrained_game: bool = False
    # Folder of the results: metrics.json, report.md, gallery.html, games/<id>, the benchmark played.
    out: str = "outputs/eval"
    judge: JudgeConfig = field(default_factory=JudgeConfig)


@dataclass
class CommandConfig:
    """What every command reads: the networks' sizes, the seed and the log level."""

    model: ModelConfig = field(default_factory=ModelConfig)
    # Seed of the random draws: new weights' initialisation, training noise and data order, sampling noise.
    seed: int = 0
    # Python logging level: DEBUG | INFO | WARNING | ERROR (ranks other than 0 log warnings and errors only).
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
    # The run folder: checkpoints/, export/, logs, run_config.json (train.yaml: outputs/train/<phase.name>).
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
    # Seconds: a request (its line, headers and body) that stalls longer is dropped; finite, > 0.
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
