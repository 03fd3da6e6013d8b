"""The ``model.mllm.tokenizer=words`` vocabulary from the data: the instructions of the training split's
clips (:mod:`animegamer.mllm.words` builds the tokenizer from them). Phase (b) and the game hand
:func:`training_word_tokenizer` to :func:`animegamer.models.game_mllm.build_game_mllm`, which calls it
only when no phase (b) export holds the tokenizer's copy."""
from __future__ import annotations

from pathlib import Path

from animegamer.config.schema import RunConfig
from animegamer.contracts.shards import INSTRUCTION, JSON, KEY
from animegamer.data.indexed import IndexedShardDataset
from animegamer.data.split import HeldOut, held_out
from animegamer.mllm.words import WORDS, word_tokenizer


def training_word_tokenizer(cfg: RunConfig):
    """The word tokenizer of ``cfg``'s data: its training split's instructions."""
    return word_tokenizer(training_instructions(cfg.data.root, cfg.data.clips, held_out(cfg)))


def training_instructions(data_root: str | Path, clips_dir: str, held: HeldOut) -> list[str]:
    """The instructions of the captioned clips of no held-out shot (``held``: the split's held-out
    shots)."""
    clips = IndexedShardDataset(Path(data_root) / clips_dir, lambda s: s[JSON], video=False)
    metas = (clips[i] for i in range(len(clips)))
    texts = [m[INSTRUCTION] for m in metas if m.get(INSTRUCTION) and not held.clip(m[KEY])]
    if not texts:
        raise ValueError(f"{Path(data_root) / clips_dir}: no captioned training clip to build the "
                         f"model.mllm.tokenizer={WORDS} vocabulary from")
    return texts
