"""Phase (b) inputs: windows of session shards turned into token sequences with their reps."""
from __future__ import annotations

from functools import partial
from pathlib import Path

from torch.utils.data import DataLoader, Dataset

from animegamer.config.schema import RunConfig
from animegamer.data.indexed import IndexedShardDataset, StepSampler
from animegamer.data.split import held_out
from animegamer.mllm.collate import Session, WindowSampler, collate_sequences, make_example
from animegamer.mllm.tokens import TokenIds

REPS = "reps.npy"


def session_of(sample: dict) -> Session:
    return Session(sample["json"]["turns"], sample[REPS], key=sample["__key__"])


class SessionWindows(Dataset):
    """Training windows: ``dataset[(index, position)]`` draws the window from a generator seeded by
    the stream position, so the same position always yields the same window (exact resume)."""

    def __init__(self, sessions: IndexedShardDataset, tokenizer, ids: TokenIds, weights, seed: int) -> None:
        self.sessions, self.tokenizer, self.ids = sessions, tokenizer, ids
        self.weights, self.seed = list(weights), seed

    def __len__(self) -> int:
        return len(self.sessions)

    def __getitem__(self, item):
        index, position = item
        session = session_of(self.sessions[index])
        window = WindowSampler(self.weights, seed=self.seed * 1_000_003 + position)(session)
        return make_example(self.ids, self.tokenizer, window)


class FullSessions(Dataset):
    """Validation games: every turn of the session, the last one the target (no randomness)."""

    def __init__(self, sessions: IndexedShardDataset, tokenizer, ids: TokenIds) -> None:
        self.sessions, self.tokenizer, self.ids = sessions, tokenizer, ids

    def __len__(self) -> int:
        return len(self.sessions)

    def __getitem__(self, index: int):
        return make_example(self.ids, self.tokenizer, session_of(self.sessions[index]))


def session_shards(cfg: RunConfig, split: str) -> IndexedShardDataset:
    keep = held_out(cfg).keep_session(split)
    return IndexedShardDataset(Path(cfg.data.root) / cfg.data.sessions, lambda s: s, keep, video=False,
                               allow_empty=split == "val")


def train_loader(cfg: RunConfig, dataset: SessionWindows, pad_id: int, start_step: int, rank: int,
                 world_size: int) -> DataLoader:
    per_step = cfg.phase.batch_size * cfg.trainer.accumulate_grad_batches
    sampler = StepSampler(len(dataset), cfg.seed, rank, world_size, start=start_step * per_step, with_position=True)
    return DataLoader(dataset, batch_size=cfg.phase.batch_size, sampler=sampler, drop_last=True,
                      num_workers=cfg.data.num_workers, collate_fn=partial(collate_sequences, pad_id=pad_id),
                      persistent_workers=cfg.data.num_workers > 0)


def val_loader(cfg: RunConfig, dataset: FullSessions, pad_id: int) -> DataLoader:
    return DataLoader(dataset, batch_size=cfg.phase.batch_size, shuffle=False,
                      collate_fn=partial(collate_sequences, pad_id=pad_id))
