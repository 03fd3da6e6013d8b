"""The game-state MLLM of phase (b): Mistral + LoRA + representation projections.

:class:`GameStateMLLM` reads a game-state sequence (see docs/architecture.md, 'Game-state token layout') and returns

- the language-model loss on the target turn's state tokens (shifted cross-entropy, mean over the
  label tokens of the batch),
- the predicted representation ``pred = output_proj(h_last[query positions])`` (B, N, D) and its
  regression loss (MSE, plus the optional cosine term of the Table-3 ablation).

Inputs (one row per sample, right padding):

- ``input_ids`` (B, L) token ids; the target turn's ``<frame_i>`` positions keep their learned
  embeddings (they are the queries);
- ``history_reps`` (B, Hmax, N, D) representations of the history turns, zero-padded to Hmax turns;
- ``history_index`` (B, L) long: -1 where a position keeps its token embedding, otherwise the flat
  row ``turn * N + frame`` of that sample's ``history_reps.reshape(Hmax * N, D)`` whose
  ``input_proj`` replaces the embedding there;
- ``query_mask`` (B, L) bool: exactly N positions per sample, in order ``<frame_0>``..``<frame_{N-1}>``;
- ``attention_mask_4d`` (B, 1, L, L): bool (True = attend) or additive float (0 = attend, negative =
  blocked), e.g. :func:`animegamer.mllm.masks.attention_mask_4d`; ``None`` builds the same rule
  (causal, bidirectional over the query block, padding keys blocked) from ``query_mask`` and the
  optional ``padding_mask`` (B, L) (True on real tokens); ``position_ids`` (B, L) optional;
- ``labels`` (B, L) with -100 where no loss, aligned with ``input_ids`` (shifted inside);
- ``target_rep`` (B, N, D);
- ``query_index`` (S, N) and ``label_index`` (M,) long, optional: the collator's flat positions of the
  queries and of the tokens that predict a label (:func:`animegamer.mllm.collate.add_host_indices`).

Design choices:

- **Trainable norms and embeddings are plain ``requires_grad``**, not peft ``modules_to_save``
  copies: modules_to_save would keep a second copy of both 32284 x 4096 matrices and put the
  trained tensors under adapter-specific names. The official checkpoint stores norms as
  ``modules_to_save.default`` copies; :mod:`animegamer.models.official_mllm` maps them onto the
  plain parameters (and ignores the unused ``original_module`` copies explicitly).
- **LoRA through peft's ``get_peft_model``**, so the LLM's parameter names are exactly the official
  ones (``llm.base_model.model.model.layers.i...lora_A.default.weight``) apart from the norms.
- **The forward calls the inner ``MistralModel`` and ``lm_head`` itself**: the LM head runs only at
  the positions that predict a label (``label_logits``), not over (B, L, 32284), which at paper
  scale is several GB of logits per step; ``return_logits=True`` adds the full logits.
- **Masks are handed to the attention kernel in its own format**: boolean for ``sdpa`` (no float
  rounding of ``finfo.min`` under bf16 autocast), additive float for ``eager`` and ``flex``. Every
  row keeps its diagonal, so a padding query never has an empty row (NaN in some kernels).
- **The training step never waits for the device**: with the collator's ``query_index`` /
  ``label_index`` the forward gathers rows at known positions (:func:`~animegamer.mllm.collate.gather_flat`)
  instead of indexing with a boolean mask, whose result size is read back from the GPU (and so is the
  backward's), and the collator checked the query counts and ``history_index`` on the host. Without
  them (hand-built batches, inference) the masks are read and checked here, giving the same rows in
  the same order, so the losses and gradients are bitwise the same either way.
- **Inference** (:meth:`generate_states`) is one prefill over the prompt (which already holds the
  query block and its bidirectional mask) giving ``pred``, then a greedy KV-cache loop for the
  state tokens. The official code runs two passes over the same prompt; one is enough because the
  query positions' hidden states do not depend on anything after the prompt.

The batch layout is the one of :mod:`animegamer.mllm.collate` (``history_index``, ``query_mask``,
``padding_mask``, ``position_ids``), and its helpers do the work: ``scatter_history`` /
``gather_queries`` for the frame positions, :func:`animegamer.mllm.masks.allowed_matrix` for the
default mask, :func:`animegamer.mllm.tokens.resize_embeddings` for the vocabulary (new input rows =
mean of the old input rows, new output rows = 3 x the mean of the old output rows).
"""
from __future__ import annotations

import inspect
import json
import logging
import re
from pathlib import Path
from typing import Sequence, TYPE_CHECKING, Dict, List, Mapping, Optional

import torch
import torch.nn.functional as F
from torch import nn

from animegamer.config.schema import MLLMConfig, ModelConfig
from animegamer.config.validate import choice, local_folder
from animegamer.mllm.collate import (check_history_index, check_query_counts, gather_flat, gather_queries,
                                     scatter_history)
from animegamer.mllm.masks import allowed_matrix
from animegamer.mllm.sequence import IGNORE_INDEX
from animegamer.mllm.tokens import NUM_FRAME_TOKENS, resize_embeddings
from animegamer.mllm.words import WORDS
from animegamer.models import lora
from animegamer.models.attention_kernels import attention_kernels, recompute_context
from animegamer.models.encoder import representation_tokens
from animegamer.utils.randomness import seeded
from animegamer.utils.state import clean_name, require

if TYPE_CHECKING:  # transformers / peft load only where an MLLM is built
    from peft import LoraConfig
    from transformers import MistralForCausalLM

logger = logging.getLogger(__name__)

MODULES_FILE = "mllm_modules.safetensors"  # projections + trained norms / embeddings
META_FILE = "mllm_meta.json"
# The official projections use the exact (erf) GELU (nn.GELU() defaults); the golden case checks it.
GELU_APPROXIMATION = "none"
SDPA = "sdpa"  # the one model.mllm.attention whose kernels model.mllm.attention_backends orders
ATTENTION_IMPLEMENTATIONS = {SDPA: "sdpa", "eager": "eager", "flex": "flex_attention"}
ATTENTIONS = tuple(ATTENTION_IMPLEMENTATIONS)  # model.mllm.attention
# Sizes a pretrained LLM folder must share with the config: the rest of the code is built from them.
_ARCHITECTURE_KEYS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                      "num_key_value_heads")
_PEFT_PREFIX = "llm.base_model.model."
_LORA_RE = re.compile(r"\.(lora_[AB])\.[^.]+\.weight$")
_PROJECTIONS = ("input_proj.", "output_proj.")


# --------------------------------------------------------------------------- helpers
def canonical_name(name: str) -> str:
    """A parameter name independent of peft wrapping: ``llm.<MistralForCausalLM name>`` or the projection name.

    ``llm.base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight`` ->
    ``llm.model.layers.0.self_attn.q_proj.weight``; LoRA matrices lose their adapter name
    (``...q_proj.lora_A.weight``). Saved module files and the official importer use these names, so
    they load into a model with or without LoRA.
    """
    if name.startswith(_PEFT_PREFIX):
        name = "llm." + name[len(_PEFT_PREFIX):]
    name = name.replace(lora.PEFT_BASE, ".")
    return _LORA_RE.sub(r".\1.weight", name)


def _projection(in_dim: int, out_dim: int) -> nn.Sequential:
    """Linear-GELU-Linear, indices 0 and 2 as in the official ``*_resampler.proj``."""
    return nn.Sequential(nn.Linear(in_dim, out_dim), nn.GELU(approximate=GELU_APPROXIMATION),
                         nn.Linear(out_dim, out_dim))


def _resize(llm: "MistralForCausalLM", vocab_size: int) -> int:
    """Grow both embedding matrices to ``vocab_size`` rows (official rule); returns the rows added.

    A pretrained LLM with more rows than the tokenizer keeps them (with a warning): its extra rows
    are never fed and only add unused logits.
    """
    # resize_embeddings reads only len(tokenizer); a range of that length stands in for the tokenizer.
    added = resize_embeddings(llm, range(vocab_size))
    rows = llm.get_input_embeddings().weight.shape[0]
    if rows > vocab_size:
        logger.warning("the LLM has %d embedding rows for a tokenizer of %d tokens; extra rows kept", rows, vocab_size)
    return added


def _positions(position_ids: Optional[torch.Tensor], padding_mask: Optional[torch.Tensor],
               input_ids: torch.Tensor) -> torch.Tensor:
    """Given positions, or 0.. over the real tokens of each row (left or right padding), (B, L)."""
    if position_ids is not None:
        return position_ids
    if padding_mask is None:
        return torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
    return (padding_mask.long().cumsum(dim=1) - 1).clamp(min=0)


def _new_cache(config):
    """An empty DynamicCache (built from the config where the installed transformers takes one)."""
    from transformers import DynamicCache

    try:
        return DynamicCache(config=config)
    except TypeError:
        return DynamicCache()


def _cache_keyword(decoder: nn.Module) -> str:
    """The decoder's name for the KV cache argument: ``cache`` in recent transformers 5 releases,
    ``past_key_values`` before (an unknown keyword would be swallowed by ``**kwargs`` and ignored)."""
    return "cache" if "cache" in inspect.signature(decoder.forward).parameters else "past_key_values"


def _allowed(mask: torch.Tensor) -> torch.Tensor:
    """Boolean view of a bool or additive float mask (True = attend)."""
    return mask if mask.dtype == torch.bool else mask == 0


# --------------------------------------------------------------------------- the module
def _greedy(logits: torch.Tensor, allowed: Optional[Sequence[Sequence[int]]], step: int) -> torch.Tensor:
    """argmax, over ``allowed[step]`` only when constrained decoding gives a set for this step."""
    if allowed is None or step >= len(allowed):
        return logits.argmax(dim=-1)
    ids = torch.as_tensor(list(allowed[step]), device=logits.device)
    return ids[logits[:, ids].argmax(dim=-1)]


class GameStateMLLM(nn.Module):
    """Mistral (``llm``) + ``input_proj`` (D -> H) + ``output_proj`` (H -> D), LoRA through peft.

    ``rep_width`` is D (the encoder width), ``num_query_tokens`` N (the representation's token
    count), ``vocab_size`` the tokenizer length including the 284 AnimeGamer tokens. ``lora=True``
    adds the adapter at construction (the phase-b default); ``lora=False`` leaves it to
    :meth:`add_lora` (or :func:`~animegamer.models.official_mllm.load_official_mllm` with merging).
    A random build (``cfg.path`` empty) starts from ``min(cfg.vocab_size, vocab_size)`` rows, so a
    small test tokenizer gives logits over exactly its tokens, and the paper sizes grow 32000 -> 32284
    by the official rule as a pretrained Mistral does. ``dtype`` applies to the whole module.
    ``seed`` makes every random initialisation (LLM weights of a random build, new embedding rows,
    projections, LoRA) reproducible without touching the caller's RNG; ``None`` uses the global RNG.
    """

    def __init__(self, cfg: MLLMConfig, rep_width: int, num_query_tokens: int, vocab_size: int,
                 dtype: Optional[torch.dtype] = None, seed: Optional[int] = 0, lora: bool = True) -> None:
        super().__init__()
        self.cfg = cfg
        self.rep_width = rep_width
        self.num_query_tokens = num_query_tokens
        with seeded(seed):
            llm = self._build_llm(cfg, dtype, vocab_size)
            added = _resize(llm, vocab_size)
            vocab_size = llm.get_input_embeddings().weight.shape[0]
            self.hidden = llm.config.hidden_size
            self.llm: nn.Module = llm
            self.input_proj = _projection(rep_width, self.hidden)
            self.output_proj = _projection(self.hidden, rep_width)
            if dtype is not None:
                self.input_proj.to(dtype)
                self.output_proj.to(dtype)
            self.vocab_size = vocab_size
            self.source = cfg.path or f"random(seed={seed})"
            logger.info("game-state MLLM: LLM %s, hidden %d, vocab %d (+%d rows), D %d, N %d", self.source,
                        self.hidden, vocab_size, added, rep_width, num_query_tokens)
            if lora:
                self.add_lora()
        self.apply_trainable()
        if cfg.compile:  # first: the checkpoint wraps the compiled layer
            from animegamer.models.compiling import compile_blocks

            compile_blocks(self.causal_lm.model.layers)
        self.set_gradient_checkpointing(cfg.gradient_checkpointing)

    @staticmethod
    def _build_llm(cfg: MLLMConfig, dtype: Optional[torch.dtype], vocab_size: int) -> "MistralForCausalLM":
        from transformers import MistralConfig, MistralForCausalLM

        if cfg.attention not in ATTENTION_IMPLEMENTATIONS:
            raise ValueError(f"mllm.attention must be one of {sorted(ATTENTION_IMPLEMENTATIONS)}, "
                             f"got {cfg.attention!r}")
        attn = ATTENTION_IMPLEMENTATIONS[cfg.attention]
        if cfg.path:
            llm = MistralForCausalLM.from_pretrained(cfg.path, local_files_only=True, dtype=dtype,
                                                     attn_implementation=attn)
            wrong = [f"{k}: folder {getattr(llm.config, k)} vs config {getattr(cfg, k)}"
                     for k in _ARCHITECTURE_KEYS if getattr(llm.config, k) != getattr(cfg, k)]
            if wrong:
                raise ValueError(f"LLM folder {cfg.path} does not match model.mllm: " + "; ".join(wrong))
            return llm
        config = MistralConfig(vocab_size=min(cfg.vocab_size, vocab_size), hidden_size=cfg.hidden_size,
                               intermediate_size=cfg.intermediate_size, num_hidden_layers=cfg.num_hidden_layers,
                               num_attention_heads=cfg.num_attention_heads,
                               num_key_value_heads=cfg.num_key_value_heads,
                               max_position_embeddings=cfg.max_position_embeddings, rms_norm_eps=cfg.rms_norm_eps,
                               rope_theta=cfg.rope_theta, sliding_window=cfg.sliding_window,
                               tie_word_embeddings=False, attn_implementation=attn)
        llm = MistralForCausalLM(config)
        return llm.to(dtype) if dtype is not None else llm

    # ----------------------------------------------------------------------- structure
    @property
    def peft_module(self) -> nn.Module:
        """The module the LoRA adapter lives in (:mod:`animegamer.models.lora`)."""
        return self.llm

    @property
    def has_lora(self) -> bool:
        return lora.has_adapter(self.llm)

    @property
    def causal_lm(self) -> "MistralForCausalLM":
        """The MistralForCausalLM itself (under the peft wrapper when LoRA is on)."""
        return self.llm.get_base_model() if self.has_lora else self.llm

    def lora_config(self, rank: Optional[int] = None, alpha: Optional[float] = None,
                    targets: Optional[List[str]] = None, dropout: Optional[float] = None) -> "LoraConfig":
        """The MLLM's LoRA (a causal LM's); unset fields from the config."""
        return lora.make_config(self.cfg, rank, alpha, targets,
                                dropout=dropout if dropout is not None else self.cfg.lora_dropout,
                                task_type="CAUSAL_LM")

    def add_lora(self, config: Optional["LoraConfig"] = None) -> None:
        """Wrap the LLM with peft LoRA; the output is unchanged at init (lora_B = 0).

        peft freezes every other LLM parameter; :meth:`apply_trainable` restores the phase's set.
        """
        if self.has_lora:
            raise RuntimeError("the MLLM already has its LoRA adapter")
        self.llm = lora.wrap(self.llm, config or self.lora_config())
        self.apply_trainable()

    def merge_lora(self) -> None:
        """Fold the adapter into the base weights (W + alpha / r * B A) and drop the peft wrapper.

        For frozen use (phase-c representation export, play): one matmul per projection instead of three.
        """
        if not self.has_lora:
            raise RuntimeError("the MLLM has no LoRA adapter to merge")
        self.llm = lora.merge_and_unwrap(self.llm)
        self.apply_trainable()

    def set_gradient_checkpointing(self, enabled: bool) -> None:
        """Recompute decoder layers in backward (non-reentrant), the paper-scale memory saver: every layer,
        or with ``cfg.gradient_checkpointing_every`` = k > 1 every k-th (:mod:`.recompute`).

        Always through :func:`~animegamer.models.recompute.checkpoint_every`, never transformers' own
        switch: its checkpoint sits inside or outside a compiled layer depending on the transformers
        version, and the recomputation's context (:func:`~animegamer.models.recompute.forward_state`)
        must run as Python, outside the graph.
        """
        from animegamer.models.recompute import checkpoint_every, forward_state

        lm = self.causal_lm
        # recomputed layers run under their forward's thread count and attention kernels, compiled or not
        context_fn = forward_state(recompute_context(self.cfg.attention_backends, self))
        checkpoint_every(lm.model.layers, self.cfg.gradient_checkpointing_every if enabled else 0, context_fn)

    # ----------------------------------------------------------------------- parameter groups
    def lora_parameters(self) -> List[str]:
        return lora.lora_names(self)

    def norm_parameters(self) -> List[str]:
        """Weights of every RMSNorm of the LLM (per-layer input / post-attention norms and the final norm)."""
        names = []
        for module_name, module in self.named_modules():
            if type(module).__name__.endswith("RMSNorm"):
                names += [f"{module_name}.{n}" for n, _ in module.named_parameters(recurse=False)]
        return names

    def embedding_parameters(self) -> List[str]:
        """The input embedding matrix and the output (LM head) matrix."""
        ids = {id(self.causal_lm.get_input_embeddings().weight), id(self.causal_lm.get_output_embeddings().weight)}
        return [n for n, p in self.named_parameters() if id(p) in ids]

    def projection_parameters(self) -> List[str]:
        return [n for n, _ in self.named_parameters() if n.startswith(_PROJECTIONS)]

    def trainable_parameter_names(self) -> List[str]:
        """The phase-b trainable set from the config.

        LoRA and both projections always; the RMSNorms with ``train_norms``; the input and output
        embedding matrices with ``train_embeddings``; every LLM weight with ``train_base``.
        """
        names = self.lora_parameters() + self.projection_parameters()
        if self.cfg.train_base:
            names += [n for n, _ in self.named_parameters() if n.startswith("llm.")]
        if self.cfg.train_norms:
            names += self.norm_parameters()
        if self.cfg.train_embeddings:
            names += self.embedding_parameters()
        return sorted(set(names))

    def apply_trainable(self) -> None:
        """Set ``requires_grad`` to exactly :meth:`trainable_parameter_names`."""
        names = set(self.trainable_parameter_names())
        for name, param in self.named_parameters():
            param.requires_grad_(name in names)

    def _saved_module_names(self) -> List[str]:
        """Non-LoRA tensors an adapter folder carries: projections, and norms / embeddings when trained."""
        return [n for n in self.trainable_parameter_names() if not lora.is_lora_name(n)]

    # ----------------------------------------------------------------------- forward pieces
    def embed_inputs(self, input_ids: torch.Tensor, history_reps: Optional[torch.Tensor] = None,
                     history_index: Optional[torch.Tensor] = None, history_checked: bool = False) -> torch.Tensor:
        """Token embeddings with the history frame positions replaced by ``input_proj(rep)`` -> (B, L, H).

        ``history_checked``: the collator already checked ``history_index`` on the host; checking it here
        would read it back from the device."""
        embeds = self.causal_lm.get_input_embeddings()(input_ids)
        if history_index is None:
            return embeds
        if history_reps is None:
            raise ValueError("history_index given without history_reps")
        if history_reps.ndim != 4 or history_reps.shape[-1] != self.rep_width:
            raise ValueError(f"history_reps must be (B, Hmax, N, {self.rep_width}), got {tuple(history_reps.shape)}")
        if not history_checked:
            check_history_index(history_index, history_reps.shape[1] * history_reps.shape[2])
        projected = self.input_proj(history_reps.to(self.input_proj[0].weight.dtype))
        embeds = scatter_history(embeds, projected, history_index)
        if projected.numel() == 0:
            # No history in the batch: keep input_proj in the graph with a zero contribution, so
            # distributed wrappers see a (zero) gradient for it on every step.
            embeds = embeds + projected.sum().to(embeds.dtype)
        return embeds

    def _allowed_mask(self, mask: Optional[torch.Tensor], query_mask: Optional[torch.Tensor],
                      padding_mask: Optional[torch.Tensor], input_ids: torch.Tensor,
                      document_ids: Optional[torch.Tensor] = None):
        """(B, 1, L, L) bool, True = attend, from the caller's mask or the default rule.

        ``mask`` None: the rule of :func:`animegamer.mllm.masks.allowed_matrix` from ``query_mask``
        (none: plain causal) and ``padding_mask`` (none: no padding). A FlexAttention ``BlockMask``
        passes through unchanged (``attention="flex"`` only).
        """
        length = input_ids.shape[1]
        if mask is not None and not isinstance(mask, torch.Tensor):
            if self.causal_lm.config._attn_implementation != "flex_attention":
                raise ValueError("a BlockMask needs mllm.attention='flex'")
            return mask
        if mask is None:
            query = query_mask if query_mask is not None else torch.zeros_like(input_ids, dtype=torch.bool)
            valid = padding_mask if padding_mask is not None else torch.ones_like(input_ids, dtype=torch.bool)
            allowed = allowed_matrix(query, valid, document_ids)[:, None]
        else:
            if mask.ndim != 4 or mask.shape[-2:] != (length, length):
                raise ValueError(f"attention_mask_4d must be (B, 1, {length}, {length}), got {tuple(mask.shape)}")
            # every row keeps its diagonal: a padded row is never empty (NaN in some kernels)
            allowed = _allowed(mask) | torch.eye(length, dtype=torch.bool, device=mask.device)
        return allowed

    def _kernel_mask(self, allowed, dtype: torch.dtype):
        """The mask in the attention kernel's format: bool for sdpa, additive float for eager / flex."""
        if not isinstance(allowed, torch.Tensor):  # BlockMask
            return allowed
        if self.causal_lm.config._attn_implementation == "sdpa":
            return allowed
        blocked = torch.tensor(torch.finfo(dtype).min, dtype=dtype, device=allowed.device)
        return torch.zeros((), dtype=dtype, device=allowed.device).where(allowed, blocked)

    def _query_hidden(self, hidden: torch.Tensor, query_mask: torch.Tensor,
                      document_ids: Optional[torch.Tensor] = None,
                      query_index: Optional[torch.Tensor] = None) -> torch.Tensor:
        """(B, L, H) -> (S, N, H) at the query positions, in sequence order: S = B, or the number of
        packed sequences with ``document_ids``. ``query_index`` (S, N): the collator's positions,
        counted and checked on the host."""
        if query_index is not None:
            return gather_flat(hidden, query_index)
        check_query_counts(query_mask, self.num_query_tokens, document_ids)
        return gather_queries(hidden, query_mask, self.num_query_tokens)

    @staticmethod
    def _label_rows(hidden: torch.Tensor, labels: torch.Tensor,
                    label_index: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The (M, H) hidden states that predict a label and their (M,) labels, batch-major; with the
        collator's ``label_index``, without reading the label mask back from the device."""
        if label_index is not None:
            return gather_flat(hidden, label_index), gather_flat(labels, label_index + 1)  # next token's label
        shifted = labels[:, 1:]
        selected = shifted != IGNORE_INDEX
        return hidden[:, :-1][selected], shifted[selected]

    def _project_out(self, hidden_queries: torch.Tensor) -> torch.Tensor:
        return self.output_proj(hidden_queries.to(self.output_proj[0].weight.dtype))

    def hidden_states(self, input_ids: torch.Tensor, attention_mask_4d: Optional[torch.Tensor] = None,
                      history_reps: Optional[torch.Tensor] = None, history_index: Optional[torch.Tensor] = None,
                      query_mask: Optional[torch.Tensor] = None, position_ids: Optional[torch.Tensor] = None,
                      padding_mask: Optional[torch.Tensor] = None,
                      document_ids: Optional[torch.Tensor] = None, history_checked: bool = False) -> torch.Tensor:
        """Last hidden states (after the final norm), (B, L, H); ``history_checked`` as for :meth:`embed_inputs`."""
        embeds = self.embed_inputs(input_ids, history_reps, history_index, history_checked)
        allowed = self._allowed_mask(attention_mask_4d, query_mask, padding_mask, input_ids, document_ids)
        with attention_kernels(self.cfg.attention_backends, embeds.is_cuda, self):
            out = self.causal_lm.model(inputs_embeds=embeds, attention_mask=self._kernel_mask(allowed, embeds.dtype),
                                       position_ids=_positions(position_ids, padding_mask, input_ids), use_cache=False)
        return out.last_hidden_state

    # ----------------------------------------------------------------------- forward
    def forward(self, input_ids: torch.Tensor, attention_mask_4d: Optional[torch.Tensor] = None,
                history_reps: Optional[torch.Tensor] = None, history_index: Optional[torch.Tensor] = None,
                query_mask: Optional[torch.Tensor] = None, labels: Optional[torch.Tensor] = None,
                target_rep: Optional[torch.Tensor] = None, position_ids: Optional[torch.Tensor] = None,
                padding_mask: Optional[torch.Tensor] = None, document_ids: Optional[torch.Tensor] = None,
                return_logits: bool = False, query_index: Optional[torch.Tensor] = None,
                label_index: Optional[torch.Tensor] = None) -> Dict[str, Optional[torch.Tensor]]:
        """Losses and predictions of one batch (see the module docstring for the input format).

        ``position_ids`` / ``padding_mask`` (B, L) as collated; without a 4-D mask, ``padding_mask``
        enters the default mask; without ``position_ids`` positions count the real tokens.
        ``query_index`` / ``label_index``: the collator's, read instead of ``query_mask`` / ``labels``
        != -100; a batch with ``query_index`` was checked by the collator (query counts,
        ``history_index``), so nothing is read back from the device.

        Returns ``loss`` (weighted sum of the present terms), ``lm_loss`` (None without labels),
        ``rec_loss`` (MSE; None without target_rep), ``cos_loss`` (1 - mean cosine over the N
        tokens; None unless ``cfg.cos_weight > 0``), ``pred`` (B, N, D; None without query_mask),
        ``label_logits`` (M, V) at the M positions that predict a label (batch-major order, float32),
        ``logits`` (B, L, V) only with ``return_logits``.
        """
        hidden = self.hidden_states(input_ids, attention_mask_4d, history_reps, history_index, query_mask,
                                    position_ids, padding_mask, document_ids,
                                    history_checked=query_index is not None)  # the collator checked both
        lm_head = self.causal_lm.get_output_embeddings()
        out: Dict[str, Optional[torch.Tensor]] = dict(loss=None, lm_loss=None, rec_loss=None, cos_loss=None,
                                                      pred=None, label_logits=None, logits=None)
        terms = []
        if labels is not None:
            rows, targets = self._label_rows(hidden, labels, label_index)
            label_logits = lm_head(rows).float()
            if targets.numel():  # a size the host knows: no device read
                out["lm_loss"] = F.cross_entropy(label_logits, targets)
            else:  # keep the head in the graph with a zero loss (no NaN from an empty mean)
                out["lm_loss"] = label_logits.sum() * 0.0
            out["label_logits"] = label_logits
            terms.append(self.cfg.lm_weight * out["lm_loss"])
        if query_mask is not None:
            pred = self._project_out(self._query_hidden(hidden, query_mask, document_ids, query_index))
            out["pred"] = pred
            if target_rep is not None:
                target = target_rep.to(pred.dtype)
                out["rec_loss"] = F.mse_loss(pred.float(), target.float())
                terms.append(self.cfg.rec_weight * out["rec_loss"])
                if self.cfg.cos_weight > 0:
                    cosine = F.cosine_similarity(pred.float(), target.float(), dim=-1)
                    out["cos_loss"] = 1.0 - cosine.mean()
                    terms.append(self.cfg.cos_weight * out["cos_loss"])
        elif target_rep is not None:
            raise ValueError("target_rep needs query_mask")
        if return_logits:
            out["logits"] = lm_head(hidden).float()
        if terms:
            out["loss"] = torch.stack([t.float() for t in terms]).sum()
        return out

    @torch.no_grad()
    def predict_rep(self, input_ids: torch.Tensor, attention_mask_4d: Optional[torch.Tensor] = None,
                    history_reps: Optional[torch.Tensor] = None, history_index: Optional[torch.Tensor] = None,
                    query_mask: Optional[torch.Tensor] = None, position_ids: Optional[torch.Tensor] = None,
                    padding_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``output_proj`` at the query positions, (B, N, D); the LM head is not run."""
        if query_mask is None:
            raise ValueError("predict_rep needs query_mask")
        hidden = self.hidden_states(input_ids, attention_mask_4d, history_reps, history_index, query_mask,
                                    position_ids, padding_mask)
        return self._project_out(self._query_hidden(hidden, query_mask))

    @torch.no_grad()
    def generate_states(self, prompt_ids: torch.Tensor, attention_mask_4d: Optional[torch.Tensor] = None,
                        history_reps: Optional[torch.Tensor] = None, history_index: Optional[torch.Tensor] = None,
                        query_mask: Optional[torch.Tensor] = None, max_new_tokens: int = 12,
                        stop_token_id: Optional[int] = None, position_ids: Optional[torch.Tensor] = None,
                        padding_mask: Optional[torch.Tensor] = None,
                        allowed_tokens: Optional[Sequence[Sequence[int]]] = None) -> Dict[str, Optional[torch.Tensor]]:
        """Greedy state tokens after a prompt ending in ``<ML>``, and the representation from the same prefill.

        Returns ``tokens`` (B, T) with T <= max_new_tokens (after ``stop_token_id``, e.g.
        ``</TURN>``, a row repeats it until every row has stopped) and ``pred`` (B, N, D) read at
        the query positions of the prompt (None without query_mask). Padded prompts must be left
        padded (the last prompt position is real in every row; ``collate_sequences(...,
        padding_side="left")``); the keys a row may attend to later are those its last prompt
        position attends to. A custom 4-D mask does not apply Mistral's sliding window, so prompt +
        new tokens must fit in it. Call it in eval mode (LoRA dropout is active in train mode).
        """
        lm = self.causal_lm
        batch, length = prompt_ids.shape
        window = getattr(lm.config, "sliding_window", None)
        if window is not None and length + max_new_tokens > window:
            raise ValueError(f"prompt ({length}) + new tokens ({max_new_tokens}) exceed the sliding window {window}")
        if padding_mask is not None and not bool(padding_mask[:, -1].all()):
            raise ValueError("batched prompts must be left padded: the last position of every row must be real")
        embeds = self.embed_inputs(prompt_ids, history_reps, history_index)
        allowed = self._allowed_mask(attention_mask_4d, query_mask, padding_mask, prompt_ids)
        if not isinstance(allowed, torch.Tensor):
            raise ValueError("generate_states needs a tensor mask, not a BlockMask")
        position_ids = _positions(position_ids, padding_mask, prompt_ids)
        with attention_kernels(self.cfg.attention_backends, embeds.is_cuda):
            return self._greedy_states(embeds, allowed, position_ids, query_mask, max_new_tokens, stop_token_id,
                                       allowed_tokens)

    def _greedy_states(self, embeds: torch.Tensor, allowed: torch.Tensor, position_ids: torch.Tensor,
                       query_mask: Optional[torch.Tensor], max_new_tokens: int, stop_token_id: Optional[int],
                       allowed_tokens: Optional[Sequence[Sequence[int]]]) -> Dict[str, Optional[torch.Tensor]]:
        """The prefill and the greedy loop of :meth:`generate_states`: ``embeds`` (B, L, H) with the
        history scattered in, ``allowed`` (B, 1, L, L) bool, ``position_ids`` (B, L), ``query_mask``
        (B, L) or None."""
        lm = self.causal_lm
        batch = embeds.shape[0]
        cache = {_cache_keyword(lm.model): _new_cache(lm.config)}
        hidden = lm.model(inputs_embeds=embeds, attention_mask=self._kernel_mask(allowed, embeds.dtype),
                          position_ids=position_ids, use_cache=True, **cache).last_hidden_state
        pred = self._project_out(self._query_hidden(hidden, query_mask)) if query_mask is not None else None

        keys = allowed[:, 0, -1, :]  # (B, L): what the last prompt position sees
        position = position_ids[:, -1:].clone()
        pick = lambda h, step: _greedy(lm.get_output_embeddings()(h), allowed_tokens, step)
        token = pick(hidden[:, -1], 0)
        done = torch.zeros(batch, dtype=torch.bool, device=embeds.device)
        tokens = []
        for step in range(max_new_tokens):
            if stop_token_id is not None:
                token = token.masked_fill(done, stop_token_id)
                done |= token == stop_token_id
            tokens.append(token)
            if step == max_new_tokens - 1 or bool(done.all()):
                break
            keys = torch.cat([keys, torch.ones(batch, 1, dtype=torch.bool, device=keys.device)], dim=1)
            position = position + 1
            step_embeds = lm.get_input_embeddings()(token[:, None])
            step_mask = self._kernel_mask(keys[:, None, None, :], step_embeds.dtype)
            hidden = lm.model(inputs_embeds=step_embeds, attention_mask=step_mask, position_ids=position,
                              use_cache=True, **cache).last_hidden_state
            token = pick(hidden[:, -1], step + 1)
        stacked = torch.stack(tokens, dim=1) if tokens else position_ids.new_zeros(batch, 0)
        return dict(tokens=stacked, pred=pred)

    # ----------------------------------------------------------------------- adapter folders
    def save_adapter(self, folder: str | Path, state: Mapping[str, torch.Tensor] | None = None) -> Path:
        """Write what phase (b) trains: the peft LoRA folder + ``mllm_modules.safetensors``.

        The modules file holds the projections and, when trained, the norms and both embedding
        matrices, under :func:`canonical_name` keys; ``mllm_meta.json`` records the sizes. ``state``:
        whole tensors gathered elsewhere (FSDP saves) under this module's clean parameter names, read
        instead of the (sharded) parameters.
        """
        from animegamer.utils.io import save_tensors

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        saved = self._saved_module_names()
        if self.has_lora:
            adapter = [n for n in self.trainable_parameter_names() if n not in saved]
            lora.save_adapter(self.llm, folder, adapter, state, "llm.", save_embedding_layers=False)
        params = dict(self.named_parameters()) if state is None else state
        require(params, saved)
        modules = {canonical_name(clean_name(n)): params[clean_name(n)].detach().contiguous().cpu() for n in saved}
        save_tensors(modules, folder / MODULES_FILE)
        meta = dict(rep_width=self.rep_width, num_query_tokens=self.num_query_tokens, vocab_size=self.vocab_size,
                    hidden_size=self.hidden, lora=self.has_lora, train_norms=self.cfg.train_norms,
                    train_embeddings=self.cfg.train_embeddings, train_base=self.cfg.train_base)
        (folder / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
        return folder

    def load_adapter(self, folder: str | Path) -> None:
        """Load a folder written by :meth:`save_adapter`; every tensor must fit, none may be left over.

        A model without LoRA gets the folder's adapter (its rank / alpha) added first.
        """
        from animegamer.checkpoints.safe_load import load_safetensors

        folder = Path(folder)
        meta = json.loads((folder / META_FILE).read_text())
        for key in ("rep_width", "num_query_tokens", "vocab_size", "hidden_size"):
            mine = self.hidden if key == "hidden_size" else getattr(self, key)
            if meta[key] != mine:
                raise ValueError(f"adapter in {folder} has {key}={meta[key]}, the model {mine}")
        if lora.holds_adapter(folder):
            lora.load_adapter(self, folder, "model")
        elif self.has_lora:
            raise ValueError(f"{folder} holds no LoRA adapter but the model has one")
        by_canonical = {canonical_name(n): p for n, p in self.named_parameters()}
        modules = load_safetensors(folder / MODULES_FILE)
        unknown = sorted(k for k in modules if k not in by_canonical)
        wrong = [f"{k}: file {tuple(v.shape)} vs model {tuple(by_canonical[k].shape)}"
                 for k, v in modules.items() if k in by_canonical and v.shape != by_canonical[k].shape]
        if unknown or wrong:
            raise ValueError(f"{folder / MODULES_FILE} does not fit the model: unknown {unknown}, shapes {wrong}")
        with torch.no_grad():
            for key, value in modules.items():
                param = by_canonical[key]
                param.copy_(value.to(dtype=param.dtype, device=param.device))


# --------------------------------------------------------------------------- config check
def check_mllm(model: ModelConfig) -> list[str]:
    """``model.mllm`` before anything is built: against the encoder (query count), its head sizes,
    its attention kernel, and its weight, tokenizer and official-checkpoint paths."""
    m = model.mllm
    problems = local_folder("model.mllm.path", m.path)
    if m.tokenizer != WORDS:
        problems += local_folder("model.mllm.tokenizer", m.tokenizer)
    queries = representation_tokens(model.encoder)
    if queries > NUM_FRAME_TOKENS:
        problems.append(f"the encoder gives {queries} representation tokens but the layout has only "
                        f"{NUM_FRAME_TOKENS} <frame_i> tokens for queries")
    if m.hidden_size % m.num_attention_heads or m.num_attention_heads % m.num_key_value_heads:
        problems.append(f"model.mllm: hidden_size={m.hidden_size}, num_attention_heads={m.num_attention_heads}, "
                        f"num_key_value_heads={m.num_key_value_heads} do not divide")
    problems += choice("model.mllm.attention", m.attention, ATTENTIONS)
    if m.official_checkpoint and not Path(m.official_checkpoint).exists():
        problems.append(f"model.mllm.official_checkpoint={m.official_checkpoint!r}: no such file")
    return problems
