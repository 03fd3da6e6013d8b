"""Phase (b) inputs: windows of session shards turned into token sequences with their reps."""
from __future__ import annotations

from dataclasses import replace
from functools import partial

from torch.utils.data import DataLoader, Dataset

from animegamer.config.schema import RunConfig
from animegamer.contracts.shards import JSON, REPS, TURNS
from animegamer.data.indexed import SKIPPED, BadSample, IndexedShardDataset, StepSampler, ignore_interrupt
from animegamer.data.split import held_out
from animegamer.data.storage import data_source
from animegamer.mllm.collate import Example, Session, WindowSampler, collate_sequences, make_example
from animegamer.mllm.packing import pack_sequences
from animegamer.mllm.tokens import TokenIds



def session_of(sample: dict) -> Session:
    return Session(sample[JSON][TURNS], sample[REPS], key=sample["__key__"])


def check_session(sample: dict) -> None:
    """A good session sample: turns that parse and reps (K, N, D) with one row per turn."""
    try:
        session_of(sample)
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise BadSample(f"not a session: {type(error).__name__}: {error}") from error


def _reporting(example: Example, sample: dict) -> Example:
    """The example, carrying the bad samples its session replaced (for the collate function)."""
    return replace(example, skipped=tuple(sample[SKIPPED])) if sample.get(SKIPPED) else example


class SessionWindows(Dataset):
    """Training windows: ``dataset[(index, position)]`` draws the window from a generator seeded by
    the stream position, so the same position always yields the same window (exact resume)."""

    def __init__(self, sessions: IndexedShardDataset, tokenizer, ids: TokenIds, weights, seed: int) -> None:
        self.sessions, self.tokenizer, self.ids = sessions, tokenizer, ids
        self.weights, self.seed = list(weights), seed

    def __len__(self) -> int:
        return len(self.sessions)

    @property
    def bad_items(self) -> list[dict]:
        return self.sessions.bad_items

    def __getitem__(self, item):
        index, position = item
        sample = self.sessions[index]
        window = WindowSampler(self.weights, seed=self.seed * 1_000_003 + position)(session_of(sample))
        return _reporting(make_example(self.ids, self.tokenizer, window), sample)


class FullSessions(Dataset):
    """Validation games: every turn of the session, the last one the target (no randomness)."""

    def __init__(self, sessions: IndexedShardDataset, tokenizer, ids: TokenIds) -> None:
        self.sessions, self.tokenizer, self.ids = sessions, tokenizer, ids

    def __len__(self) -> int:
        return len(self.sessions)

    @property
    def bad_items(self) -> list[dict]:
        return self.sessions.bad_items

    def __getitem__(self, index: int):
        sample = self.sessions[index]
        return _reporting(make_example(self.ids, self.tokenizer, session_of(sample)), sample)


def session_shards(cfg: RunConfig, split: str) -> IndexedShardDataset:
    keep = held_out(cfg).keep_session(split)
    return IndexedShardDataset(data_source(cfg.data, cfg.data.sessions), _identity, keep, video=False,
                               allow_empty=split == "val", skip_bad=True, check=check_session)


def _identity(sample: dict) -> dict:
    return sample


def train_loader(cfg: RunConfig, dataset: SessionWindows, pad_id: int, start_step: int, rank: int,
                 world_size: int) -> DataLoader:
    per_step = cfg.phase.batch_size * cfg.trainer.accumulate_grad_batches
    sampler = StepSampler(len(dataset), cfg.seed, rank, world_size, start=start_step * per_step, with_position=True)
    if cfg.phase.pack_tokens:
        collate = partial(pack_sequences, pad_id=pad_id, capacity=cfg.phase.pack_tokens,
                          pad_to_multiple_of=cfg.phase.pad_to_multiple)
    else:
        collate = partial(collate_sequences, pad_id=pad_id, pad_to_multiple_of=cfg.phase.pad_to_multiple)
    # Pinned on GPU runs: a batch carries every window's history reps (tens of MB at paper sizes), and
    # from pageable memory Lightning's copy to the device stalls the step's start while the GPU idles.
    return DataLoader(dataset, batch_size=cfg.phase.batch_size, sampler=sampler, drop_last=True,
                      num_workers=cfg.data.num_workers, collate_fn=collate,
                      persistent_workers=cfg.data.num_workers > 0, pin_memory=cfg.trainer.accelerator != "cpu",
                      worker_init_fn=ignore_interrupt)


def val_loader(cfg: RunConfig, dataset: FullSessions, pad_id: int) -> DataLoader:
    return DataLoader(dataset, batch_size=cfg.phase.batch_size, shuffle=False,
                      collate_fn=partial(collate_sequences, pad_id=pad_id,
                                         pad_to_multiple_of=cfg.phase.pad_to_multiple))
