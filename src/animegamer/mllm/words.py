"""``model.mllm.tokenizer=words``: a word-level tokenizer of the training split's instructions.

A random-weight MLLM preset (``tiny``, ``small``) has no pretrained tokenizer. With the byte tokenizer
every instruction value is a run of bytes, and a random LLM has to learn to compose them into words
before any state rule can be read: on held-out shots it falls below the majority class, where one token
per word lets it read the rules it was trained on.

Mistral's tokenizer gives a pretrained model whole words or a few pieces of them; this tokenizer is
that stand-in: one token per word or punctuation mark of the training instructions, ``<unk>`` for a
word they never hold. Held-out clips are left out, so their words never enter the vocabulary (the data
layer reads them: :mod:`animegamer.data.words`).

The vocabulary is the sorted word set, so the same data gives the same ids; a phase (b) export keeps
its own copy (``tokenizer/``), which the game, the evaluation and the adaptation step load.
"""
from __future__ import annotations

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

