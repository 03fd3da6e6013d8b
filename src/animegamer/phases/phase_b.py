"""Phase (b): the game-state MLLM learns the next turn's state tokens and representation.

Inputs are windows of 1..K turns of a session (history turns carry ``input_proj(rep)`` at their
frame positions; the target turn's frame tokens are the queries). Losses: cross-entropy on the
target's state tokens and MSE (optionally + cosine) on the representation (DESIGN sections 4, 5).
"""
from __future__ import annotations

import logging
from pathlib import Path

import lightning as L
import torch

from animegamer.checkpoints.export import load_export, save_export
from animegamer.config.schema import RunConfig
from animegamer.mllm.masks import flex_block_mask
from animegamer.mllm.sequence import IGNORE_INDEX
from animegamer.mllm.tokens import TokenIds, add_animegamer_tokens, load_tokenizer
from animegamer.models.encoder import representation_tokens
from animegamer.models.mllm import GameStateMLLM
from animegamer.phases.common import clip_gradients, keep_trained, make_optimizer, micro_step, step_seed

log = logging.getLogger(__name__)

PHASE = "b"
MODEL_KEYS = ("input_ids", "history_reps", "history_index", "query_mask", "labels", "target_rep", "position_ids",
              "padding_mask", "document_ids")


def game_tokenizer(cfg: RunConfig):
    """The configured tokenizer with every AnimeGamer token present, and its ids by name."""
    mllm = cfg.model.mllm
    tokenizer = load_tokenizer(mllm.tokenizer or mllm.path or None)
    added = add_animegamer_tokens(tokenizer)
    if added:
        log.info("added %d AnimeGamer tokens to the tokenizer", len(added))
    return tokenizer, TokenIds.from_tokenizer(tokenizer)


def build_mllm(cfg: RunConfig, vocab_size: int) -> GameStateMLLM:
    return GameStateMLLM(cfg.model.mllm, cfg.model.encoder.width, representation_tokens(cfg.model.encoder),
                         vocab_size, seed=cfg.seed)


def state_accuracy(label_logits: torch.Tensor, labels: torch.Tensor, ids: TokenIds) -> torch.Tensor:
    """Accuracy over the target's state-value tokens (``<Strength_k>``), not the fixed markers."""
    targets = labels[:, 1:][labels[:, 1:] != IGNORE_INDEX]  # the M labels, in label_logits' order
    is_state = torch.isin(targets, torch.tensor(list(ids.strengths), device=targets.device))
    predicted = label_logits.argmax(dim=-1)
    return (predicted[is_state] == targets[is_state]).float().mean()


def attention_for(kind: str, batch: dict):
    """The mask in the form that keeps the kernel fast: a FlexAttention BlockMask (the query block is
    a few 128-blocks, the rest causal, so most blocks are skipped or dense) or None, which lets the
    model build its boolean mask for SDPA / eager."""
    if kind == "flex":
        return flex_block_mask(batch["query_mask"], batch["padding_mask"], document_ids=batch.get("document_ids"))
    return None


class PhaseB(L.LightningModule):
    def __init__(self, cfg: RunConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tokenizer, self.ids = game_tokenizer(cfg)
        self.model = build_mllm(cfg, len(self.tokenizer))
        if cfg.model.mllm.official_checkpoint:
            import_official_mllm(self.model, cfg.model.mllm.official_checkpoint)
        if cfg.phase.init_from:
            load_export(cfg.phase.init_from, self.model)
        self.trainable = self.model.trainable_parameter_names()
        self.strict_loading = False  # checkpoints hold only what trains

    def run_model(self, batch: dict) -> dict:
        return self.model(attention_mask_4d=attention_for(self.cfg.model.mllm.attention, batch),
                          **{k: batch[k] for k in MODEL_KEYS if k in batch})

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        # LoRA dropout draws from the global RNG: seed it from the step so a resumed run redraws it.
        torch.manual_seed(step_seed(self.cfg.seed, micro_step(self, batch_idx), self.global_rank))
        out = self.run_model(batch)
        size = self.batch_size_of(batch)
        for name in ("lm_loss", "rec_loss", "cos_loss"):
            if out[name] is not None:
                self.log(f"train/{name}", out[name], batch_size=size)
        self.log("train/loss", out["loss"], prog_bar=True, batch_size=size, sync_dist=True)
        return out["loss"]

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        out = self.run_model(batch)
        size = batch["input_ids"].shape[0]
        accuracy = state_accuracy(out["label_logits"], batch["labels"], self.ids)
        for name, value in (("loss", out["loss"]), ("lm_loss", out["lm_loss"]), ("rec_loss", out["rec_loss"]),
                            ("state_accuracy", accuracy)):
            self.log(f"val/{name}", value, batch_size=size, sync_dist=True)

    def batch_size_of(self, batch: dict) -> int:
        """Sequences in the batch (a packed row may hold several)."""
        return int(batch["lengths"].shape[0])

    def tokens_of(self, batch: dict) -> int:
        return int(batch["padding_mask"].sum())

    def flops_per_batch(self, batch: dict) -> float:
        """Forward FLOPs: the LLM over every real token (padding excluded), the LM head at the label
        positions only (that is all the model computes), the projections."""
        from animegamer.training.throughput import transformer_forward_flops

        m = self.cfg.model.mllm
        kv = m.hidden_size // m.num_attention_heads * m.num_key_value_heads
        flops = sum(transformer_forward_flops(int(n), m.hidden_size, m.num_hidden_layers, m.intermediate_size, kv,
                                              gated_mlp=True) for n in batch["lengths"])
        labels = int((batch["labels"] != IGNORE_INDEX).sum())
        return flops + 2 * labels * m.hidden_size * self.model.vocab_size

    def configure_optimizers(self):
        return make_optimizer(self.model, self.cfg.phase)

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None) -> None:
        clip_gradients(self, gradient_clip_val, self.cfg.trainer.max_nonfinite_in_row)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        keep_trained(checkpoint, self.trainable)


def import_official_mllm(model: GameStateMLLM, path: str) -> None:
    from animegamer.models.official_mllm import load_official_mllm

    report = load_official_mllm(path, model)
    if not report.ok:
        raise ValueError(f"{path}: {report.summary()}")


def export_phase_b(module: PhaseB, folder: str | Path, meta: dict, state: dict | None = None) -> Path:
    """Trained tensors + json, the peft adapter folder and the tokenizer (DESIGN section 7).

    ``state``: the tensors to export, gathered by an FSDP save (names relative to ``module.model``);
    None reads the module."""
    folder = save_export(folder, module.model, {"phase": PHASE, **meta}, state=state)
    module.model.save_adapter(Path(folder) / "adapter", state)
    module.tokenizer.save_pretrained(str(Path(folder) / "tokenizer"))
    return Path(folder)
