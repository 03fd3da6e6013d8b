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
- **Inference** (:meth:`generate_states`) is one prefill and a greedy KV-cache loop,
  :mod:`animegamer.models.mllm_generate`; adapter folders are :mod:`animegamer.models.mllm_adapters`.

The batch layout is the one of :mod:`animegamer.mllm.collate` (``history_index``, ``query_mask``,
``padding_mask``, ``position_ids``), and its helpers do the work: ``scatter_history`` /
``gather_queries`` for the frame positions, :func:`animegamer.mllm.masks.allowed_matrix` for the
default mask, :func:`animegamer.mllm.tokens.resize_embeddings` for the vocabulary (new input rows =
mean of the old input rows, new output rows = 3 x the mean of the old output rows).
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Optional

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
from animegamer.models.compiling import compile_blocks
from animegamer.models.encoder import representation_tokens
from animegamer.models.mllm_adapters import AdapterFolders
from animegamer.models.mllm_generate import StateGeneration, token_positions
from animegamer.models.recompute import checkpoint_every, forward_state
from animegamer.utils.randomness import seeded

if TYPE_CHECKING:  # transformers / peft load only where an MLLM is built
    from peft import LoraConfig
    from transformers import MistralForCausalLM

logger = logging.getLogger(__name__)

# The official projections use the exact (erf) GELU (nn.GELU() defaults); the golden case checks it.
GELU_APPROXIMATION = "none"
SDPA = "sdpa"  # the one model.mllm.attention whose kernels model.mllm.attention_backends orders
ATTENTION_IMPLEMENTATIONS = {SDPA: "sdpa", "eager": "eager", "flex": "flex_attention"}
ATTENTIONS = tuple(ATTENTION_IMPLEMENTATIONS)  # model.mllm.attention
# Sizes a pretrained LLM folder must share with the config: the rest of the code is built from them.
_ARCHITECTURE_KEYS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                      "num_key_value_heads")
_PROJECTIONS = ("input_proj.", "output_proj.")


# --------------------------------------------------------------------------- helpers
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


def _allowed(mask: torch.Tensor) -> torch.Tensor:
    """Boolean view of a bool or additive float mask (True = attend)."""
    return mask if mask.dtype == torch.bool else mask == 0


# --------------------------------------------------------------------------- the module
class GameStateMLLM(StateGeneration, AdapterFolders, nn.Module):
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
        positions = token_positions(position_ids, padding_mask, input_ids)
        with attention_kernels(self.cfg.attention_backends, embeds.is_cuda, self):
            out = self.causal_lm.model(inputs_embeds=embeds, attention_mask=self._kernel_mask(allowed, embeds.dtype),
                                       position_ids=positions, use_cache=False)
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
