"""Phase (b): the game-state MLLM learns the next turn's state tokens and representation.

Inputs are windows of 1..K turns of a session (history turns carry ``input_proj(rep)`` at their
frame positions; the target turn's frame tokens are the queries). Losses: cross-entropy on the
target's state tokens and MSE (optionally + cosine) on the representation.
"""
from __future__ import annotations

from pathlib import Path

import lightning as L
import torch

from animegamer.checkpoints.export import save_export
from animegamer.config.schema import RunConfig
from animegamer.contracts.exports import PHASE_B
from animegamer.data.words import training_word_tokenizer
from animegamer.mllm.collate import LABEL_INDEX
from animegamer.mllm.sequence import IGNORE_INDEX
from animegamer.mllm.tokens import TokenIds
from animegamer.models.game_mllm import TOKENIZER_DIR, build_game_mllm, run_batch
from animegamer.phases.common import clip_gradients, init_exports, keep_trained, make_optimizer, micro_step
from animegamer.training.throughput import transformer_forward_flops
from animegamer.utils.randomness import step_seed


# Batch entries only the host reads (the batch size, token and FLOP counts of the throughput log): they
# stay on the host when the batch moves to the device, so reading them never waits for the GPU. Callbacks
# see this host copy; inside training_step a DDP / FSDP wrapper may already have moved the whole batch
# (these entries too) to the device, so the step itself must not read them.
HOST_KEYS = ("lengths",)


def label_count(batch: dict) -> int:
    """The batch's label tokens: the length of the collator's ``label_index`` (a size the host knows),
    else counted from ``labels``."""
    index = batch.get(LABEL_INDEX)
    return index.shape[0] if index is not None else int((batch["labels"] != IGNORE_INDEX).sum())


def state_accuracy(label_logits: torch.Tensor, labels: torch.Tensor, ids: TokenIds) -> torch.Tensor:
    """Accuracy over the target's state-value tokens (``<Strength_k>``), not the fixed markers."""
    targets = labels[:, 1:][labels[:, 1:] != IGNORE_INDEX]  # the M labels, in label_logits' order
    is_state = torch.isin(targets, torch.tensor(list(ids.strengths), device=targets.device))
    predicted = label_logits.argmax(dim=-1)
    return (predicted[is_state] == targets[is_state]).float().mean()


class PhaseB(L.LightningModule):
    def __init__(self, cfg: RunConfig) -> None:
        super().__init__()
        self.cfg = cfg
        built = build_game_mllm(cfg, init_exports(cfg.phase), words=training_word_tokenizer)
        self.model, self.tokenizer, self.ids = built.model, built.tokenizer, built.ids
        self.trainable = self.model.trainable_parameter_names()
        self.strict_loading = False  # checkpoints hold only what trains

    def run_model(self, batch: dict) -> dict:
        return run_batch(self.model, batch)

    def transfer_batch_to_device(self, batch, device, dataloader_idx: int):
        """Everything but :data:`HOST_KEYS` to ``device`` (Lightning's move, pinned and non-blocking)."""
        host = {key: batch[key] for key in HOST_KEYS if key in batch}
        moving = {key: value for key, value in batch.items() if key not in host}
        return {**super().transfer_batch_to_device(moving, device, dataloader_idx), **host}

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
        """Real tokens (padding excluded), from the host's ``lengths``."""
        return int(batch["lengths"].sum())

    def flops_per_batch(self, batch: dict) -> float:
        """Forward FLOPs: the LLM over every real token (padding excluded), the LM head at the label
        positions only (that is all the model computes), the projections."""
        m = self.cfg.model.mllm
        kv = m.hidden_size // m.num_attention_heads * m.num_key_value_heads
        # lengths stay on the host (HOST_KEYS): reading them waits for no GPU
        flops = sum(transformer_forward_flops(n, m.hidden_size, m.num_hidden_layers, m.intermediate_size, kv,
                                              gated_mlp=True) for n in batch["lengths"].tolist())
        return flops + 2 * label_count(batch) * m.hidden_size * self.model.vocab_size

    def configure_optimizers(self):
        return make_optimizer(self.model, self.cfg.phase)

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None) -> None:
        clip_gradients(self, gradient_clip_val, self.cfg.trainer.max_nonfinite_in_row)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        keep_trained(checkpoint, self.trainable)


def export_phase_b(module: PhaseB, folder: str | Path, meta: dict, state: dict | None = None) -> Path:
    """Trained tensors + json, the peft adapter folder and the tokenizer (see docs/architecture.md, 'Exports').

    ``state``: the tensors to export, gathered by an FSDP save (names relative to ``module.model``);
    None reads the module."""
    folder = save_export(folder, module.model, {"phase": PHASE_B, **meta}, state=state)
    module.model.save_adapter(Path(folder) / "adapter", state)
    module.tokenizer.save_pretrained(str(Path(folder) / TOKENIZER_DIR))
    return Path(folder)
