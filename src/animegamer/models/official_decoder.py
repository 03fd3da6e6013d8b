"""Importer of the official AnimeGamer decoder checkpoint (SAT ``DiffusionTransformer``).

The official decoder checkpoints (``VDM_Decoder-*/.../mp_rank_00_model_states.pt``) hold
``{"module": state_dict}`` with keys prefixed ``model.diffusion_model.``. This module maps them onto
:class:`~animegamer.models.encoder.ActionAwareEncoder` and
:class:`~animegamer.models.decoder.MotionScopeDecoder` (diffusers' CogVideoX transformer) and reports
every official key it could not place and every module parameter it left unset, so an incomplete
import is visible instead of silently training from partly random weights.

Layout facts used (checked against ``shared/reference/official_decoder_golden``, which this mapping
reproduces; see ``tests/test_official_decoder.py``):

- ``attention.query_key_value`` is q, k, v stacked along the output dimension;
- LoRA ``matrix_A.j`` / ``matrix_B.j`` (j = 0, 1, 2 for q, k, v; 0 for ``dense``) with scaling
  alpha / r, alpha = 1 in the official release;
- ``adaLN_modulations.i.1`` has 12 chunks ``[shift, scale, gate] x (attn, ff)`` for vision then
  the same for text; diffusers' ``norm1.linear`` / ``norm2.linear`` hold ``shift, scale, gate,
  enc_shift, enc_scale, enc_gate`` of one half, i.e. chunks (0, 1, 2, 6, 7, 8) and (3, 4, 5, 9, 10, 11);
- ``input_layernorm`` / ``post_attention_layernorm`` are the LayerNorms shared by the vision and
  text streams, i.e. ``CogVideoXLayerNormZero.norm`` of ``norm1`` / ``norm2``;
- ``final_layer.adaLN_modulation.1`` chunks are (shift, scale), the order diffusers' ``norm_out``
  uses with ``chunk_dim=1``, so it maps without reordering;
- ``pos_embed.pos_embedding`` is a fixed sin-cos table (text part zero); it is not a weight in
  diffusers (recomputed from the grid), so it is compared with diffusers' table and reported;
- ``patch_embed.output_mix_layer_norm`` is not used by the official forward (the golden outputs
  are reproduced without it), so it is listed as known-unused, not as unplaced.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Dict, Iterator, Optional, Tuple

import torch
from torch import nn

from animegamer.models.decoder import MotionScopeDecoder
from animegamer.models.encoder import ActionAwareEncoder
from animegamer.models.lora import ADAPTER as LORA_ADAPTER
from animegamer.checkpoints.safe_load import load_weights_only
from animegamer.models.official_import import ImportReport, copy_into

logger = logging.getLogger(__name__)

OFFICIAL_PREFIX = "model.diffusion_model."
OFFICIAL_LORA_ALPHA = 1.0  # the official LoRA mixin scales by alpha / r with alpha 1
POS_EMBED_KEY = "mixins.pos_embed.pos_embedding"
POS_EMBED_TOLERANCE = 1e-4  # the tables agree to float32 rounding of sin/cos; anything more is a real difference
# Official keys with no counterpart because the official forward never reads them.
KNOWN_UNUSED = ("mixins.patch_embed.output_mix_layer_norm.weight", "mixins.patch_embed.output_mix_layer_norm.bias")
QKV = ("to_q", "to_k", "to_v")
ADALN_CHUNKS = 12
ATTN_HALF_CHUNKS = (0, 1, 2, 6, 7, 8)  # shift, scale, gate (vision) then the same for text
FF_HALF_CHUNKS = (3, 4, 5, 9, 10, 11)
_AFFINE = ("weight", "bias")


# --------------------------------------------------------------------------- reading
def read_official_state_dict(path: str | Path) -> Dict[str, torch.Tensor]:
    """Official keys without ``model.diffusion_model.``; accepts the .pt file or its folder."""
    path = Path(path)
    if path.is_dir():
        candidates = sorted(path.rglob("mp_rank_00_model_states.pt"))
        if not candidates:
            raise FileNotFoundError(f"no mp_rank_00_model_states.pt under {path}")
        path = candidates[0]
    checkpoint = load_weights_only(path)
    state = checkpoint.get("module", checkpoint)
    return {k[len(OFFICIAL_PREFIX):] if k.startswith(OFFICIAL_PREFIX) else k: v for k, v in state.items()}


def count_layers(state: Dict[str, torch.Tensor]) -> int:
    """Number of transformer layers in an official state dict."""
    ids = {int(k.split(".")[2]) for k in state if k.startswith("transformer.layers.")}
    return max(ids) + 1 if ids else 0


# --------------------------------------------------------------------------- key mapping
def _pairs(official: str, ours: str) -> Iterator[Tuple[str, str]]:
    for suffix in _AFFINE:
        yield f"{official}.{suffix}", f"{ours}.{suffix}"


def _encoder_map() -> Dict[str, str]:
    """Official patch-embed encoder keys -> ActionAwareEncoder parameter names."""
    pe = "mixins.patch_embed"
    mapping: Dict[str, str] = {}
    for official, ours in (("text_proj.0", "text_proj.0"), ("text_proj.2", "text_proj.2"),
                           ("txt_mix_layer_norm", "text_norm"), ("ip_proj.0", "image_proj.0"),
                           ("ip_proj.2", "image_proj.2"), ("ip_mix_layer_norm", "image_norm")):
        mapping.update(_pairs(f"{pe}.{official}", ours))
    return mapping


def _decoder_direct_map(num_layers: int) -> Dict[str, str]:
    """One-to-one official keys -> transformer parameter names (everything but split/merged tensors)."""
    mapping: Dict[str, str] = {}
    for official, ours in (("mixins.patch_embed.proj", "patch_embed.proj"), ("time_embed.0", "time_embedding.linear_1"),
                           ("time_embed.2", "time_embedding.linear_2"), ("flow_embed.0", "ofs_embedding.linear_1"),
                           ("flow_embed.2", "ofs_embedding.linear_2"), ("transformer.final_layernorm", "norm_final"),
                           ("mixins.final_layer.norm_final", "norm_out.norm"),
                           ("mixins.final_layer.adaLN_modulation.1", "norm_out.linear"),
                           ("mixins.final_layer.linear", "proj_out")):
        mapping.update(_pairs(official, ours))
    for i in range(num_layers):
        layer, block, adaln = f"transformer.layers.{i}", f"transformer_blocks.{i}", "mixins.adaln_layer"
        for official, ours in ((f"{layer}.input_layernorm", f"{block}.norm1.norm"),
                               (f"{layer}.post_attention_layernorm", f"{block}.norm2.norm"),
                               (f"{layer}.mlp.dense_h_to_4h", f"{block}.ff.net.0.proj"),
                               (f"{layer}.mlp.dense_4h_to_h", f"{block}.ff.net.2"),
                               (f"{adaln}.query_layernorm_list.{i}", f"{block}.attn1.norm_q"),
                               (f"{adaln}.key_layernorm_list.{i}", f"{block}.attn1.norm_k")):
            mapping.update(_pairs(official, ours))
    return mapping


def _linear_name(params: Dict[str, nn.Parameter], module: str, suffix: str) -> str:
    """``module.weight`` or, once peft wrapped the Linear, ``module.base_layer.weight``."""
    wrapped = f"{module}.base_layer.{suffix}"
    return wrapped if wrapped in params else f"{module}.{suffix}"


# --------------------------------------------------------------------------- importer
class _Importer:
    """Collects target tensors for every module parameter, then copies them in one pass."""

    def __init__(self, state: Dict[str, torch.Tensor], decoder: MotionScopeDecoder, merge_lora: bool) -> None:
        self.state = state
        self.decoder = decoder
        self.merge_lora = merge_lora
        self.params = dict(decoder.transformer.named_parameters())
        self.targets: Dict[str, torch.Tensor] = {}  # transformer parameter name -> value
        self.used: set[str] = set()
        self.report = ImportReport()

    def take(self, key: str) -> Optional[torch.Tensor]:
        """The official tensor (marked used), or None when the checkpoint lacks it."""
        value = self.state.get(key)
        if value is not None:
            self.used.add(key)
        return value

    def set(self, name: str, value: torch.Tensor) -> None:
        """Target value of one transformer parameter; an unknown name is a mapping bug, not a skip."""
        if name not in self.params:
            raise KeyError(f"official decoder mapping names a missing parameter: {name}")
        self.targets[name] = value

    def run(self) -> ImportReport:
        num_layers = count_layers(self.state)
        for official, ours in _decoder_direct_map(num_layers).items():
            name = self._resolve(ours)
            if name in self.params and official in self.state:
                self.set(name, self.take(official))
        for i in range(num_layers):
            self._attention(i)
            self._adaln(i)
        self._check_pos_embedding()
        return self.report

    def _resolve(self, ours: str) -> str:
        module, suffix = ours.rsplit(".", 1)
        return _linear_name(self.params, module, suffix)

    # ------------------------------------------------------------------- attention + LoRA
    def _attention(self, i: int) -> None:
        base = f"transformer.layers.{i}.attention"
        block = f"transformer_blocks.{i}.attn1"
        qkv = f"{base}.query_key_value"
        weight, bias = self.take(f"{qkv}.original.weight"), self.take(f"{qkv}.original.bias")
        if weight is not None:
            # (3 * hidden, hidden) -> three (hidden, hidden): q, k, v stacked along the output dim.
            for j, (w, b) in enumerate(zip(weight.chunk(3, dim=0), bias.chunk(3, dim=0))):
                self._lora_linear(f"{block}.{QKV[j]}", w, b, qkv, j)
        weight, bias = self.take(f"{base}.dense.original.weight"), self.take(f"{base}.dense.original.bias")
        if weight is not None:
            self._lora_linear(f"{block}.to_out.0", weight, bias, f"{base}.dense", 0)

    def _lora_linear(self, module: str, weight: torch.Tensor, bias: torch.Tensor, official: str, j: int) -> None:
        """Base weight plus the official LoRA pair, merged into it or placed into the peft adapter."""
        keys = (f"{official}.matrix_A.{j}", f"{official}.matrix_B.{j}")
        lora_a, lora_b = self.state.get(keys[0]), self.state.get(keys[1])
        a_name, b_name = (f"{module}.lora_{m}.{LORA_ADAPTER}.weight" for m in ("A", "B"))
        has_peft = a_name in self.params
        if lora_a is not None and self.merge_lora:
            scaling = OFFICIAL_LORA_ALPHA / lora_a.shape[0]
            # W + s * B A in float64: rounded once, to the parameter's dtype, when copied in.
            weight = weight.double() + scaling * (lora_b.double() @ lora_a.double())
            self.used.update(keys)
            if has_peft:  # a fresh adapter on a merged base must add nothing: B = 0, A as initialised
                self.set(b_name, torch.zeros_like(self.params[b_name]))
                self.set(a_name, self.params[a_name].detach().clone())
        elif lora_a is not None and has_peft:
            self._place_lora(module, lora_a, lora_b)
            self.used.update(keys)
        self.set(_linear_name(self.params, module, "weight"), weight)
        self.set(_linear_name(self.params, module, "bias"), bias)

    def _place_lora(self, module: str, lora_a: torch.Tensor, lora_b: torch.Tensor) -> None:
        """peft computes B(A x) * alpha_d / r_d; B is rescaled so the product equals the official one."""
        ours = self.decoder.transformer.get_submodule(module).scaling[LORA_ADAPTER]
        official = OFFICIAL_LORA_ALPHA / lora_a.shape[0]
        if abs(ours - official) > 1e-12:
            note = f"LoRA scaling {ours:g} differs from the official {official:g}: lora_B rescaled"
            if note not in self.report.notes:
                self.report.notes.append(note)
        self.set(f"{module}.lora_A.{LORA_ADAPTER}.weight", lora_a)
        self.set(f"{module}.lora_B.{LORA_ADAPTER}.weight", lora_b * (official / ours))

    # ------------------------------------------------------------------- expert AdaLN
    def _adaln(self, i: int) -> None:
        key = f"mixins.adaln_layer.adaLN_modulations.{i}.1"
        weight, bias = self.take(f"{key}.weight"), self.take(f"{key}.bias")
        if weight is None:
            return
        # (12 * hidden, time) -> 12 chunks of (hidden, time); each half takes six of them.
        w_chunks, b_chunks = weight.chunk(ADALN_CHUNKS, dim=0), bias.chunk(ADALN_CHUNKS, dim=0)
        for norm, chunks in (("norm1", ATTN_HALF_CHUNKS), ("norm2", FF_HALF_CHUNKS)):
            self.set(f"transformer_blocks.{i}.{norm}.linear.weight", torch.cat([w_chunks[c] for c in chunks]))
            self.set(f"transformer_blocks.{i}.{norm}.linear.bias", torch.cat([b_chunks[c] for c in chunks]))

    # ------------------------------------------------------------------- position table
    def _check_pos_embedding(self) -> None:
        """Compare the official sin-cos table with diffusers' (a buffer there, not a weight)."""
        official = self.state.get(POS_EMBED_KEY)
        if official is None:
            return
        ours = self._diffusers_pos_embedding(official.shape[1])
        if ours is None or ours.shape != official.shape:
            self.report.notes.append(f"{POS_EMBED_KEY} {tuple(official.shape)}: no diffusers table of that size")
            return
        diff = (ours - official.float()).abs().max().item()
        self.report.notes.append(f"{POS_EMBED_KEY}: max |official - diffusers| = {diff:.3g}")
        if diff <= POS_EMBED_TOLERANCE:
            self.used.add(POS_EMBED_KEY)

    def _diffusers_pos_embedding(self, length: int) -> Optional[torch.Tensor]:
        """diffusers' joint table for the configured spatial grid and as many frames as ``length`` holds."""
        patch_embed = self.decoder.transformer.patch_embed
        cfg = self.decoder.cfg
        per_frame = (cfg.sample_height // cfg.patch_size) * (cfg.sample_width // cfg.patch_size)
        video_tokens = length - patch_embed.max_text_seq_length
        if video_tokens <= 0 or video_tokens % per_frame:
            return None
        frames = (video_tokens // per_frame - 1) * patch_embed.temporal_compression_ratio + 1
        return patch_embed._get_positional_embeddings(cfg.sample_height, cfg.sample_width, frames).cpu()


def _import_encoder(state: Dict[str, torch.Tensor], encoder: ActionAwareEncoder, used: set) -> Dict[str, torch.Tensor]:
    params = dict(encoder.named_parameters())
    targets = {}
    for official, ours in _encoder_map().items():
        if official in state and ours in params:
            targets[ours] = state[official]
            used.add(official)
    return targets


def load_official_decoder(path: str | Path, encoder: Optional[ActionAwareEncoder], decoder: MotionScopeDecoder,
                          merge_lora: bool = False) -> ImportReport:
    """Load the official decoder checkpoint into the encoder (may be None) and decoder, in place.

    ``merge_lora=False`` needs the decoder's LoRA adapter (it is added when missing) and keeps the
    official LoRA trainable; ``merge_lora=True`` folds it into the base weights (alpha / r scaling),
    the starting point for training a fresh adapter.
    """
    state = read_official_state_dict(path)
    has_lora = any(".matrix_A." in k for k in state)
    if has_lora and not merge_lora and not decoder.has_lora:
        rank = next(v.shape[0] for k, v in state.items() if ".matrix_A." in k)
        decoder.add_lora(decoder.lora_config(rank=rank))
        logger.info("added a rank-%d LoRA adapter to hold the official one", rank)
    importer = _Importer(state, decoder, merge_lora)
    report = importer.run()
    encoder_targets = _import_encoder(state, encoder, importer.used) if encoder is not None else {}
    copy_into(importer.params, importer.targets, "decoder")
    if encoder is not None:
        copy_into(dict(encoder.named_parameters()), encoder_targets, "decoder")
    report.known_unused = [k for k in KNOWN_UNUSED if k in state]
    importer.used.update(report.known_unused)
    report.unplaced_keys = sorted(k for k in state if k not in importer.used)
    unset = [f"decoder.transformer.{n}" for n in importer.params if n not in importer.targets]
    if encoder is not None:
        unset += [f"encoder.{n}" for n, _ in encoder.named_parameters() if n not in encoder_targets]
    report.unset_parameters = sorted(unset)
    report.placed = len(importer.targets) + len(encoder_targets)
    logger.info("official decoder import from %s: %s", path, report.summary())
    for line in report.notes:
        logger.info("official decoder import: %s", line)
    return report
