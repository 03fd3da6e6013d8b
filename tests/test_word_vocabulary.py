"""The ``model.mllm.tokenizer=words`` vocabulary: the data layer reads it from the training split's clips,
and the MLLM is built with it only through the source its caller hands in."""
from __future__ import annotations

import json

import pytest
import webdataset as wds
from tokenizers.pre_tokenizers import Whitespace

from animegamer.config.schema import MLLMConfig, ModelConfig, RunConfig, TrainDataConfig
from animegamer.contracts.files import CLIPS_DIR, MANIFEST, SHOTS_FILE
from animegamer.contracts.shards import INSTRUCTION, JSON, KEY
from animegamer.data.split import held_out
from animegamer.data.words import training_instructions, training_word_tokenizer
from animegamer.mllm.tokens import BYTE_SPECIALS
from animegamer.mllm.words import WORDS
from animegamer.models.checks import check_tokenizer
from animegamer.models.game_mllm import TOKENIZER_DIR, game_tokenizer

INSTRUCTIONS = ("Character: Momo; Motion: slowly walk; Background: night harbor.",
                "Character: Pazu; Motion: rapidly dash; Background: noon seaside.",
                "Character: Qiqi; Motion: gently sit; Background: dawn forest.",
                "Character: Pazu and Momo; Motion: slowly sit; Background: noon harbor.")
VAL_FRACTION = 0.2  # the stable hash holds out the shots of the first and third clip


def _clips(root, instructions):
    """Clip shards of one film, a shot per clip, every clip captioned but the last (no instruction)."""
    folder = root / CLIPS_DIR
    folder.mkdir(parents=True)
    keys = [f"film-{i:06d}" for i in range(len(instructions) + 1)]
    with wds.TarWriter(str(folder / "shard-000000.tar"), encoder=False) as tar:
        for key, instruction in zip(keys, [*instructions, None]):
            tar.write({"__key__": key, JSON: json.dumps({KEY: key, INSTRUCTION: instruction}).encode()})
    (folder / MANIFEST).write_text(json.dumps({"kind": "clips", "shards": [{"name": "shard-000000.tar", "count": len(keys)}]}))
    (folder / SHOTS_FILE).write_text(json.dumps({key: f"film/shot-{i:05d}" for i, key in enumerate(keys)}))
    return keys


def _words(text: str) -> list[str]:
    return [word for word, _ in Whitespace().pre_tokenize_str(text)]


def _cfg(root) -> RunConfig:
    return RunConfig(model=ModelConfig(mllm=MLLMConfig(tokenizer=WORDS)),
                     data=TrainDataConfig(root=str(root), val_fraction=VAL_FRACTION))


def test_the_vocabulary_holds_the_training_clips_words_only(tmp_path):
    _clips(tmp_path, INSTRUCTIONS)
    cfg = _cfg(tmp_path)
    split = held_out(cfg)
    training = [text for i, text in enumerate(INSTRUCTIONS) if not split.clip(f"film-{i:06d}")]
    assert training == [INSTRUCTIONS[1], INSTRUCTIONS[3]]
    assert training_instructions(tmp_path, CLIPS_DIR, split) == training
    vocab = training_word_tokenizer(cfg).get_vocab()
    training_words = {word for text in training for word in _words(text)}
    held_words = {word for text in INSTRUCTIONS for word in _words(text)} - training_words
    assert held_words and not held_words & set(vocab)
    assert set(vocab) == training_words | set(BYTE_SPECIALS)
    words = sorted(set(vocab) - set(BYTE_SPECIALS))
    assert [vocab[w] for w in words] == list(range(len(BYTE_SPECIALS), len(BYTE_SPECIALS) + len(words)))


def test_the_mllm_builds_the_words_tokenizer_only_through_its_callers_source(tmp_path):
    _clips(tmp_path, INSTRUCTIONS)
    cfg = _cfg(tmp_path)
    asked = []

    def source(run: RunConfig):
        asked.append(run)
        return training_word_tokenizer(run)

    built, ids = game_tokenizer(cfg, words=source)
    assert asked == [cfg]
    words = training_word_tokenizer(cfg).get_vocab()
    assert {name: built.get_vocab()[name] for name in words} == words  # the AnimeGamer tokens come after
    assert ids.pad == words[BYTE_SPECIALS[0]] and min(ids.strengths) >= len(words)
    with pytest.raises(ValueError, match=f"tokenizer={WORDS}: no phase \\(b\\) export is given"):
        game_tokenizer(cfg)
    with pytest.raises(ValueError, match=f"export {tmp_path} holds no {TOKENIZER_DIR}/"):
        game_tokenizer(cfg, [tmp_path])


def test_the_adaptation_steps_preflight_asks_the_export_for_its_word_tokenizer(tmp_path):
    """The adaptation step reads no training split: with ``words`` its phase (b) export must hold the
    tokenizer's copy, which the pre-flight checks before any model is built; training and evaluation
    build the vocabulary from their data instead."""
    model = ModelConfig(mllm=MLLMConfig(tokenizer=WORDS))
    export = [("pipeline.adaptation.export", str(tmp_path))]
    assert check_tokenizer(model, export, words_from_data=False) == [
        f"pipeline.adaptation.export={str(tmp_path)!r}: model.mllm.tokenizer={WORDS} needs the phase (b) export's "
        f"copy of the tokenizer it trained with ({TOKENIZER_DIR}/), and there is none"]
    assert check_tokenizer(model, export) == []
    assert check_tokenizer(model, [("pipeline.adaptation.export", str(tmp_path / "missing"))], words_from_data=False) == []
    (tmp_path / TOKENIZER_DIR).mkdir()
    assert check_tokenizer(model, export, words_from_data=False) == []


def test_the_tokenizer_check_adds_the_animegamer_tokens_to_its_own_copy_silently(caplog):
    """The pre-flight adds the tokens to a throwaway copy: the run that loads the tokenizer says it did, a
    check (which may still refuse the run) does not."""
    import logging

    with caplog.at_level(logging.INFO):
        assert check_tokenizer(ModelConfig(mllm=MLLMConfig())) == []
    assert "AnimeGamer tokens" not in caplog.text
