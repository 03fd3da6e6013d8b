"""``model.mllm.tokenizer=words``: a word-level tokenizer of the training split's instructions.

A random-weight MLLM preset (``tiny``, ``small``) has no pretrained tokenizer. With the byte tokenizer
every instruction value is a run of bytes, and a random LLM has to learn to compose them into words
before any state rule can be read. On the known-answer CI data (phase (b) 300 steps) it fitted its
training sessions (state accuracy 0.89) and scored 0.33 on held-out shots, below the majority class's
0.50; with this tokenizer 0.97-0.98 and 0.75-0.83 (seeds 0-2: SC and ST right on every held-out turn,
ET on one of three held-out shots, its backgrounds being in one or two training shots each there).

Mistral's tokenizer gives a pretrained model whole words or a few pieces of them; this tokenizer is
that stand-in: one token per word or punctuation mark of the training instructions, ``<unk>`` for a
word they never hold. Held-out clips are left out, so their words never enter the vocabulary.

The vocabulary is the sorted word set, so the same data gives the same ids; a phase (b) export keeps
its own copy (``tokenizer/``), which the game, the evaluation and the adaptation step load.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

from tokenizers import Tokenizer, pre_tokenizers, processors
from tokenizers import models as tokenizer_models

from animegamer.mllm.tokens import BYTE_SPECIALS

WORDS = "words"  # the model.mllm.tokenizer value that selects this tokenizer


def word_tokenizer(texts: Iterable[str]):
    """A Llama-style tokenizer (<unk>/<s>/</s> ids 0..2, ``<s>`` added in front, ``<unk>`` the pad) whose
    other tokens are the words and punctuation marks of ``texts``, in sorted order."""
    from transformers import PreTrainedTokenizerFast

    splitter = pre_tokenizers.Whitespace()  # runs of word characters, and of punctuation
    words = sorted({word for text in texts for word, _ in splitter.pre_tokenize_str(text)})
    if not words:
        raise ValueError("a word tokenizer needs at least one instruction with a word in it")
    unk, bos, eos = BYTE_SPECIALS
    vocab = {name: i for i, name in enumerate(BYTE_SPECIALS)}
    vocab.update({word: len(BYTE_SPECIALS) + i for i, word in enumerate(words)})
    backend = Tokenizer(tokenizer_models.WordLevel(vocab=vocab, unk_token=unk))
    backend.pre_tokenizer = splitter
    backend.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, vocab[bos])])
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=bos, eos_token=eos, unk_token=unk,
                                   pad_token=unk, clean_up_tokenization_spaces=False)


def training_word_tokenizer(cfg):
    """The word tokenizer of ``cfg``'s data (a ``RunConfig``): its training split's instructions."""
    from animegamer.data.split import held_out

    return word_tokenizer(training_instructions(cfg.data.root, cfg.data.clips, held_out(cfg)))


def training_instructions(data_root: str | Path, clips_dir: str, held_out) -> list[str]:
    """The instructions of the captioned clips of no held-out shot (``held_out``: a
    :class:`animegamer.data.split.HeldOut`)."""
    from animegamer.data.indexed import IndexedShardDataset

    clips = IndexedShardDataset(Path(data_root) / clips_dir, lambda s: s["json"], video=False)
    metas = (clips[i] for i in range(len(clips)))
    texts = [m["instruction"] for m in metas if m.get("instruction") and not held_out.clip(m["key"])]
    if not texts:
        raise ValueError(f"{Path(data_root) / clips_dir}: no captioned training clip to build the "
                         f"model.mllm.tokenizer={WORDS} vocabulary from")
    return texts
