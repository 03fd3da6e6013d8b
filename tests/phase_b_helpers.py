"""Synthetic session shards and a tiny phase (b) config for training tests."""
from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from animegamer.config.compose import compose_config
from synthetic import session_shards
from animegamer.mllm.tokens import TokenIds, add_animegamer_tokens, byte_tokenizer


@pytest.fixture(scope="module")
def model_cfg():
    """The tiny preset's ``model`` node, typed (``ModelConfig``); a test module imports the fixture."""
    return OmegaConf.to_object(compose_config("pipeline", ["model=tiny"]).model)


@pytest.fixture(scope="module")
def vocab():
    """The byte tokenizer of random builds with the AnimeGamer tokens, and their ids."""
    tokenizer = byte_tokenizer()
    add_animegamer_tokens(tokenizer)
    return tokenizer, TokenIds.from_tokenizer(tokenizer)


def write_synthetic_sessions(root: Path, sessions: int = 10, turns: int = 5, tokens: int = 46, width: int = 32,
                             seed: int = 0) -> Path:
    return session_shards(root, sessions, turns, tokens, width, seed)


def tiny_b_cfg(data_root: Path, output: Path, *overrides: str):
    composed = compose_config("train", [
        "model=tiny", "phase=b", "trainer=cpu", "logger=csv", f"data.root={data_root}", f"output_dir={output}",
        "phase.max_steps=6", "phase.warmup_steps=2", "phase.lr=3e-3", "phase.batch_size=2",
        "phase.val_every_n_steps=1000", "checkpoint.every_n_steps=2", "trainer.log_every_n_steps=1",
        "data.val_fraction=0.2", "model.mllm.lora_dropout=0.05", *overrides,
    ])
    return composed, OmegaConf.to_object(composed)
