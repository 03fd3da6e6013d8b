"""MotionScope decoder: CogVideoX-2B's transformer conditioned on the representation and motion scope.

Built on diffusers' ``CogVideoXTransformer3DModel`` without forking its forward:

- **Representation as the text stream.** The pretrained ``patch_embed.text_proj`` (T5 4096 ->
  hidden) is replaced by ``nn.Identity``: the representation already has the hidden width and is
  what the official network feeds the text stream. The transformer's ``max_text_seq_length`` is set
  to the representation's token count N because the joint position embedding (zeros on the text
  part, 3-D sin-cos on the video part) is laid out for exactly N text tokens.
- **Motion scope.** diffusers' ``ofs`` path (sinusoid -> TimestepEmbedding, added to the timestep
  embedding before the blocks) sits exactly where the official ``flow_embed`` sits, only at other
  widths; ``ofs_proj`` / ``ofs_embedding`` are rebuilt at the official widths (sinusoid of the hidden
  width, cosine first; Linear(hidden, time) - SiLU - Linear(time, time)) and the flow value is
  passed as ``ofs``. The last Linear starts at zero, so a new embedder leaves the pretrained
  decoder's output unchanged until it learns.
- **Final AdaLN epsilon.** The official final layer normalises with eps 1e-6 where diffusers builds
  ``norm_out`` with the block eps (1e-5); it is set to 1e-6 to reproduce the official network.
- **LoRA** through peft on the attention projections, added after construction (``add_lora``)
  because phase a1 trains without it and a2 adds it.
- **A pre-trained base** for presets without downloaded weights: the plain transformer, trained whole
  (phase ``a_base``), is written as a diffusers folder (``save_base``) that ``model.decoder.path`` loads.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Mapping, Optional

import torch
from torch import nn

from animegamer.checkpoints.safe_load import SAFETENSORS_SUFFIX, load_safetensors, safetensors_keys
from animegamer.config.schema import PAPER_IMAGE_TOKENS, PAPER_TEXT_TOKENS, DecoderConfig
from animegamer.config.validate import choice
from animegamer.models import lora
from animegamer.models.attention_kernels import attention_kernels, recompute_context
from animegamer.models.recompute import checkpoint_every, checkpoint_options, forward_state
from animegamer.utils.io import save_tensors

if TYPE_CHECKING:  # diffusers / peft load only where a decoder is built
    from diffusers import CogVideoXTransformer3DModel
    from peft import LoraConfig

logger = logging.getLogger(__name__)

FINAL_ADALN_EPS = 1e-6  # official final-layer LayerNorm eps (diffusers would use the block eps)
FLIP_SIN_TO_COS = True  # official sinusoids put the cosine half first
FREQ_SHIFT = 0  # official sinusoid frequencies: exp(-log(10000) * i / half)
TIMESTEP_ACTIVATION = "silu"
PAPER_REP_TOKENS = PAPER_TEXT_TOKENS + PAPER_IMAGE_TOKENS  # 226
# torch.compile modes for model.decoder.compile_mode; those that record CUDA graphs (sampling only).
COMPILE_MODES = ("default", "max-autotune-no-cudagraphs", "reduce-overhead", "max-autotune")
DEFAULT_COMPILE_MODE = COMPILE_MODES[0]
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")
# The folder a trained base is written to (:meth:`MotionScopeDecoder.save_base`): diffusers' pipeline layout.
BASE_FOLDER = "transformer"
_TRANSFORMER_SUBFOLDERS = ("", BASE_FOLDER)
_DIFFUSERS_CONFIG = "config.json"
_TEXT_PROJ = "patch_embed.text_proj."  # the projection diffusers builds and this module bypasses
_TRANSFORMER_PREFIX = "transformer."
# Settings a checkpoint folder must share with the config: the sizes the rest of the code relies
# on, and the CogVideoX-2B choices (sin-cos positions, no temporal patching) this module assumes.
_ARCHITECTURE_KEYS = ("num_layers", "num_attention_heads", "attention_head_dim", "in_channels", "out_channels",
                      "patch_size", "time_embed_dim", "use_rotary_positional_embeddings", "flip_sin_to_cos",
                      "freq_shift")
# Per-block AdaLN modulation linears (CogVideoXLayerNormZero.linear of the attention and FF halves).
_ADALN_SUFFIXES = (".norm1.linear.weight", ".norm1.linear.bias", ".norm2.linear.weight", ".norm2.linear.bias")
_FINAL_ADALN_PREFIX = "transformer.norm_out.linear."
_OFS_KEY_PREFIX = "ofs_embedding."
_MOTION_SCOPE_PREFIX = _TRANSFORMER_PREFIX + _OFS_KEY_PREFIX


def check_decoder_compile(dec: DecoderConfig, training: bool) -> list[str]:
    """``model.decoder.compile_mode``: a torch.compile mode, and CUDA graphs only where nothing trains."""
    problems = choice("model.decoder.compile_mode", str(dec.compile_mode), COMPILE_MODES)
    if dec.compile_mode != DEFAULT_COMPILE_MODE and not dec.compile:
        problems.append(f"model.decoder.compile_mode={dec.compile_mode!r} needs model.decoder.compile=true")
    if training and dec.compile_mode in CUDA_GRAPH_MODES:
        problems.append(f"model.decoder.compile_mode={dec.compile_mode!r} records CUDA graphs, for sampling only "
                        "(the game, evaluation); training takes default or max-autotune-no-cudagraphs")
    return problems


# --------------------------------------------------------------------------- building
def _transformer_kwargs(cfg: DecoderConfig, rep_tokens: int) -> Dict[str, object]:
    """diffusers config of a CogVideoX-2B-style transformer at the configured sizes."""
    hidden = cfg.num_attention_heads * cfg.attention_head_dim
    return dict(
        num_attention_heads=cfg.num_attention_heads,
        attention_head_dim=cfg.attention_head_dim,
        in_channels=cfg.in_channels,
        out_channels=cfg.out_channels,
        flip_sin_to_cos=FLIP_SIN_TO_COS,
        freq_shift=FREQ_SHIFT,
        time_embed_dim=cfg.time_embed_dim,
        ofs_embed_dim=None,  # the motion-scope embedder is rebuilt at the official widths below
        text_embed_dim=hidden,  # irrelevant: text_proj is replaced by Identity
        num_layers=cfg.num_layers,
        sample_width=cfg.sample_width,
        sample_height=cfg.sample_height,
        sample_frames=cfg.sample_frames,
        patch_size=cfg.patch_size,
        max_text_seq_length=rep_tokens,
        spatial_interpolation_scale=cfg.spatial_interpolation_scale,
        temporal_interpolation_scale=cfg.temporal_interpolation_scale,
        use_rotary_positional_embeddings=False,
    )


def _find_transformer_folder(path: str) -> Path:
    """The diffusers transformer folder: ``path`` itself or a pipeline folder's ``transformer/``."""
    root = Path(path).expanduser()
    for sub in _TRANSFORMER_SUBFOLDERS:
        folder = root / sub if sub else root
        if (folder / _DIFFUSERS_CONFIG).is_file():
            return folder
    raise FileNotFoundError(f"no diffusers transformer ({_DIFFUSERS_CONFIG}) in {root} or {root / 'transformer'}")


def _check_loaded_sizes(model: "CogVideoXTransformer3DModel", expected: Dict[str, object], folder: Path) -> None:
    """Refuse a folder whose architecture disagrees with the config, naming every difference."""
    wrong = [f"{key}: folder {model.config[key]} vs config {expected[key]}"
             for key in _ARCHITECTURE_KEYS if model.config[key] != expected[key]]
    if model.config.get("patch_size_t") is not None:
        wrong.append(f"patch_size_t: folder {model.config['patch_size_t']} (CogVideoX 1.5) vs config None")
    if wrong:
        raise ValueError(f"decoder weights in {folder} do not match model.decoder: " + "; ".join(wrong))


def build_transformer(cfg: DecoderConfig, rep_tokens: int) -> "CogVideoXTransformer3DModel":
    """Random weights at the configured sizes, or the local folder ``cfg.path`` (never the hub).

    Position-embedding settings (sample grid, interpolation scales, text length) are taken from the
    config even when loading, since they are buffers computed at build time, not weights.
    """
    from diffusers import CogVideoXTransformer3DModel

    kwargs = _transformer_kwargs(cfg, rep_tokens)
    if not cfg.path:
        return CogVideoXTransformer3DModel(**kwargs)
    folder = _find_transformer_folder(cfg.path)
    overrides = {k: kwargs[k] for k in ("sample_width", "sample_height", "sample_frames", "max_text_seq_length",
                                         "spatial_interpolation_scale", "temporal_interpolation_scale")}
    model = CogVideoXTransformer3DModel.from_pretrained(folder, local_files_only=True, **overrides)
    _check_loaded_sizes(model, kwargs, folder)
    logger.info("decoder transformer loaded from %s", folder)
    return model


def _restore_motion_scope(embedding: nn.Module, cfg: DecoderConfig) -> None:
    """Fill a new motion-scope embedder from ``cfg.path`` when that folder holds one.

    A transformer saved with ``save_pretrained`` after motion-scope training keeps the
    ``ofs_embedding.*`` tensors, but its config says ``ofs_embed_dim=None`` (the embedder is not a
    diffusers option at these widths), so ``from_pretrained`` drops them; they are read back here.
    """
    folder = _find_transformer_folder(cfg.path)
    found: Dict[str, torch.Tensor] = {}
    for file in sorted(folder.glob(f"*{SAFETENSORS_SUFFIX}")):
        tensors = load_safetensors(file, lambda key: key.startswith(_OFS_KEY_PREFIX))
        found.update({key[len(_OFS_KEY_PREFIX):]: value for key, value in tensors.items()})
    if not found:
        return  # a plain CogVideoX folder: the embedder starts at its zero-output init
    embedding.load_state_dict(found, strict=True)
    logger.info("motion-scope embedder restored from %s", folder)


def _warn_unused_motion_scope(cfg: DecoderConfig) -> None:
    """A folder trained with the motion scope, loaded without it, renders as if the input were never
    trained: nothing fails, so the log says it."""
    folder = _find_transformer_folder(cfg.path)
    if any(key.startswith(_OFS_KEY_PREFIX) for file in sorted(folder.glob(f"*{SAFETENSORS_SUFFIX}"))
           for key in safetensors_keys(file)):
        logger.warning("%s holds a trained motion-scope embedder that model.decoder.motion_scope=false leaves "
                       "unused: the decoder renders without its motion-scope input", folder)


def _motion_scope_modules(hidden: int, time_embed_dim: int) -> tuple[nn.Module, nn.Module]:
    """(ofs_proj, ofs_embedding) at the official widths, the output linear zero-initialised."""
    from diffusers.models.embeddings import TimestepEmbedding, Timesteps

    proj = Timesteps(hidden, flip_sin_to_cos=FLIP_SIN_TO_COS, downscale_freq_shift=FREQ_SHIFT)
    embedding = TimestepEmbedding(hidden, time_embed_dim, act_fn=TIMESTEP_ACTIVATION)
    nn.init.zeros_(embedding.linear_2.weight)
    nn.init.zeros_(embedding.linear_2.bias)
    return proj, embedding


# --------------------------------------------------------------------------- the module
class MotionScopeDecoder(nn.Module):
    """v-prediction of CogVideoX-2B given the representation (text stream) and the motion scope.

    ``rep_tokens`` is the encoder's token count N (``ActionAwareEncoder.num_tokens``), which fixes
    the layout of the joint position embedding. Parameter names reported by the group helpers are
    those of ``self.named_parameters()``.
    """

    def __init__(self, cfg: DecoderConfig, rep_width: int, rep_tokens: int = PAPER_REP_TOKENS) -> None:
        super().__init__()
        self.cfg = cfg
        self.hidden = cfg.num_attention_heads * cfg.attention_head_dim
        if rep_width != self.hidden:
            raise ValueError(f"representation width {rep_width} must equal the decoder hidden size {self.hidden} "
                             "(the pretrained text projection is bypassed)")
        self.rep_tokens = rep_tokens
        self.transformer = build_transformer(cfg, rep_tokens)
        self.transformer.patch_embed.text_proj = nn.Identity()
        self.transformer.norm_out.norm.eps = FINAL_ADALN_EPS
        if cfg.motion_scope:
            self.transformer.ofs_proj, self.transformer.ofs_embedding = _motion_scope_modules(
                self.hidden, cfg.time_embed_dim)
            if cfg.path:
                _restore_motion_scope(self.transformer.ofs_embedding, cfg)
        else:
            self.transformer.ofs_proj, self.transformer.ofs_embedding = None, None
            if cfg.path:
                _warn_unused_motion_scope(cfg)
        self.set_gradient_checkpointing(cfg.gradient_checkpointing)
        if cfg.compile:  # in place: parameter names stay the same; the first call compiles
            self.transformer.compile(dynamic=False, mode=cfg.compile_mode)
        # The sampler marks each denoising step for a compiled network that replays CUDA graphs.
        self.uses_cuda_graphs = cfg.compile and cfg.compile_mode in CUDA_GRAPH_MODES

    # ----------------------------------------------------------------------- forward
    def forward(self, latents: torch.Tensor, timestep: torch.Tensor, rep: torch.Tensor,
                flow: Optional[torch.Tensor] = None) -> torch.Tensor:
        """latents (B, T, C, H, W), timestep (B,), rep (B, N, D), flow (B,) -> (B, T, C, H, W) velocity.

        ``flow`` is the motion-scope value (ignored, and may be None, without motion scope).
        """
        self._check_inputs(latents, rep)
        if self.cfg.motion_scope:
            if flow is None:
                raise ValueError("the motion-scope decoder needs a flow value per sample")
            flow = flow.to(device=latents.device, dtype=torch.float32)
        else:
            flow = None
        with attention_kernels(self.cfg.attention_backends, latents.is_cuda, self):
            (velocity,) = self.transformer(hidden_states=latents, encoder_hidden_states=rep, timestep=timestep,
                                           ofs=flow, return_dict=False)
        return velocity

    def _check_inputs(self, latents: torch.Tensor, rep: torch.Tensor) -> None:
        """Name the shapes: a token-count mismatch otherwise fails inside the position embedding."""
        if latents.ndim != 5 or latents.shape[2] != self.cfg.in_channels:
            raise ValueError(f"latents must be (B, T, {self.cfg.in_channels}, H, W), got {tuple(latents.shape)}")
        if rep.ndim != 3 or rep.shape[1:] != (self.rep_tokens, self.hidden):
            raise ValueError(f"rep must be (B, {self.rep_tokens}, {self.hidden}), got {tuple(rep.shape)}")

    # ----------------------------------------------------------------------- switches
    def set_gradient_checkpointing(self, enabled: bool, every: Optional[int] = None) -> None:
        """Recompute block activations in backward (the paper-scale memory saver): every block through
        diffusers, or every k-th (``every``, default the config's) through :mod:`.recompute`."""
        from torch.utils.checkpoint import checkpoint

        every = self.cfg.gradient_checkpointing_every if every is None else every
        # Recomputed blocks keep their forward's attention kernels and thread count. The whole transformer
        # compiled traces the checkpoints into its graph, which fixes both (and takes no context_fn).
        context_fn = None if self.cfg.compile else forward_state(recompute_context(self.cfg.attention_backends, self))
        options = checkpoint_options(context_fn)
        if enabled and every == 1:
            self.transformer.enable_gradient_checkpointing(
                lambda block, *args: checkpoint(block.__call__, *args, **options))
        else:
            self.transformer.disable_gradient_checkpointing()
        checkpoint_every(self.transformer.transformer_blocks, every if enabled and every > 1 else 0, context_fn)

    # ----------------------------------------------------------------------- LoRA
    @property
    def peft_module(self) -> nn.Module:
        """The module the LoRA adapter lives in (:mod:`animegamer.models.lora`)."""
        return self.transformer

    @property
    def has_lora(self) -> bool:
        return lora.has_adapter(self.transformer)

    def lora_config(self, rank: Optional[int] = None, alpha: Optional[float] = None,
                    targets: Optional[List[str]] = None) -> "LoraConfig":
        """The decoder's LoRA (no dropout); unset fields from the config."""
        return lora.make_config(self.cfg, rank, alpha, targets)

    def add_lora(self, config: Optional["LoraConfig"] = None) -> None:
        """Inject the LoRA adapter; the output is unchanged at init because lora_B starts at zero, and
        what trains stays as it was, plus the new LoRA matrices."""
        if self.has_lora:
            raise RuntimeError("the decoder already has its LoRA adapter")
        lora.inject(self.transformer, config or self.lora_config())
        logger.info("decoder LoRA added: %d tensors", len(self.lora_parameters()))

    def merge_lora(self) -> None:
        """Fold the adapter into the base weights for frozen use (play): the wrapped layers then run
        their base Linear alone, one matmul instead of three. Parameter names do not change."""
        if not self.has_lora:
            raise RuntimeError("the decoder has no LoRA adapter to merge")
        lora.merge_in_place(self.transformer)

    def save_adapter(self, folder: str | Path, state: Mapping[str, torch.Tensor] | None = None) -> Path:
        """Write the adapter as a peft folder (adapter_model.safetensors + adapter_config.json).

        ``state``: whole tensors gathered elsewhere (FSDP saves) under this module's clean parameter
        names, read instead of the (sharded) parameters; it must hold every LoRA matrix."""
        if not self.has_lora:
            raise RuntimeError("the decoder has no LoRA adapter to save")
        return lora.save_adapter(self.transformer, folder, self.lora_parameters(), state, _TRANSFORMER_PREFIX)

    def load_adapter(self, folder: str | Path) -> None:
        """Load a peft adapter folder, adding the adapter (with the folder's r/alpha) when absent."""
        lora.load_adapter(self, folder, "decoder")

    # ----------------------------------------------------------------------- a pre-trained base
    def save_base(self, folder: str | Path, state: Mapping[str, torch.Tensor] | None = None) -> Path:
        """Write the transformer as a diffusers folder that ``model.decoder.path`` loads
        (:func:`build_transformer`): ``config.json`` and its safetensors weights.

        Only a plain video diffusion transformer is a base (no motion-scope embedder, no LoRA): the
        embedder is added zero-initialised over it, as over CogVideoX's weights. diffusers builds the
        text projection from the config and would warn about its missing weights and leave it random,
        so an identity ``Linear(hidden, hidden)`` (the same map as the ``nn.Identity`` it stands for)
        is written in its place; loading replaces it by ``nn.Identity`` again.

        ``state``: whole tensors gathered elsewhere (FSDP saves) under this module's parameter names,
        read instead of the (sharded) parameters; it must hold every tensor of the transformer."""
        from diffusers.utils import SAFETENSORS_WEIGHTS_NAME

        if self.cfg.motion_scope or self.has_lora:
            raise RuntimeError("only a plain transformer is saved as a base: build it with "
                               "model.decoder.motion_scope=false and without LoRA")
        own = self.transformer.state_dict()
        tensors = own if state is None else {name.removeprefix(_TRANSFORMER_PREFIX): value
                                             for name, value in state.items() if name.startswith(_TRANSFORMER_PREFIX)}
        missing = sorted(set(own) - set(tensors))
        if missing:
            raise ValueError(f"the decoder state lacks {len(missing)} transformer tensors, e.g. {missing[:5]}")
        tensors = {name: tensors[name].detach().to("cpu").contiguous() for name in own}
        dtype = next(iter(tensors.values())).dtype
        tensors[_TEXT_PROJ + "weight"] = torch.eye(self.hidden, dtype=dtype)
        tensors[_TEXT_PROJ + "bias"] = torch.zeros(self.hidden, dtype=dtype)
        config = json.loads(self.transformer.to_json_string())
        config["text_embed_dim"] = self.hidden  # the identity projection's input width
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        save_tensors(tensors, folder / SAFETENSORS_WEIGHTS_NAME, metadata={"format": "pt"})
        (folder / _DIFFUSERS_CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        logger.info("decoder base -> %s (%d tensors)", folder, len(tensors))
        return folder

    # ----------------------------------------------------------------------- parameter groups
    def motion_scope_parameters(self) -> List[str]:
        """Names of the motion-scope embedder's parameters (empty without motion scope)."""
        return [n for n, _ in self.named_parameters() if n.startswith(_MOTION_SCOPE_PREFIX)]

    def adaln_parameters(self, include_final: bool = False) -> List[str]:
        """Names of the per-block AdaLN modulation linears (norm1.linear and norm2.linear of each block).

        The final layer's modulation (``norm_out.linear``) is not a per-block AdaLN and stays frozen
        by default, as the paper trains only the per-block ones; ``include_final`` adds it.
        """
        names = [n for n, _ in self.named_parameters()
                 if n.startswith("transformer.transformer_blocks.") and n.endswith(_ADALN_SUFFIXES)]
        if include_final:
            names += [n for n, _ in self.named_parameters() if n.startswith(_FINAL_ADALN_PREFIX)]
        return names

    def base_parameters(self) -> List[str]:
        """Names of every parameter of the transformer: what pre-training a base trains (before any
        LoRA is added; with an adapter the base weights are its frozen ``base_layer``)."""
        if self.has_lora:
            raise RuntimeError("the decoder has a LoRA adapter: its base weights are frozen under it")
        return [n for n, _ in self.named_parameters()]

    def lora_parameters(self) -> List[str]:
        """Names of the LoRA matrices (empty before ``add_lora``)."""
        return lora.lora_names(self)
