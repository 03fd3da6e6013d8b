"""The AnimeGamer vocabulary: token names, tokenizer loading, id lookup, embedding resize.

The 284 tokens are generated from named counts in the official order; appended to Mistral's
32000-token vocabulary they get the official ids 32000..32283. Ids are never written as numbers
anywhere in the project: :class:`TokenIds` looks every one up by name in the tokenizer at hand, so any
Llama/Mistral tokenizer works once :func:`add_animegamer_tokens` has added what it lacks.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from tokenizers import AddedToken, Tokenizer, decoders, pre_tokenizers, processors
from tokenizers import models as tokenizer_models

from animegamer.contracts.states import ENTERTAINMENT, MOTION_LEVEL, SOCIAL, STAMINA, STATE_KEYS

# transformers (seconds to import) is imported where a tokenizer is made: configuration checks read this
# module's names without it.
logger = logging.getLogger(__name__)

NUM_FRAME_TOKENS = 256  # <frame_00000>..<frame_00255>: room for up to 256 query tokens (paper N = 226)
STRENGTH_MIN, STRENGTH_MAX = -5, 5  # <Strength_-5>..<Strength_5>
NEW_OUTPUT_ROW_SCALE = 3.0  # official recipe: new lm_head rows = 3 x the mean of the old rows

IMG_START, IMG_END = "<img>", "</img>"
VID_START, VID_END = "<vid>", "</vid>"
FRAME_START, FRAME_END = "<frame>", "</frame>"
VISUAL = "<visual>"
ML_START, ML_END = "<ML>", "</ML>"
SC_START, SC_END = "<SC>", "</SC>"
ET_START, ET_END = "<ET>", "</ET>"
ST_START, ST_END = "<ST>", "</ST>"
TURN_START, TURN_END = "<TURN>", "</TURN>"

STATE_TAGS = {key: (f"<{key}>", f"</{key}>") for key in STATE_KEYS}


def frame_token(i: int) -> str:
    return f"<frame_{i:05d}>"


def strength_token(k: int) -> str:
    return f"<Strength_{k}>"


FRAME_TOKENS = tuple(frame_token(i) for i in range(NUM_FRAME_TOKENS))
STRENGTH_TOKENS = tuple(strength_token(k) for k in range(STRENGTH_MIN, STRENGTH_MAX + 1))
MEDIA_TOKENS = (IMG_START, IMG_END, VID_START, VID_END, FRAME_START, FRAME_END)
STATE_MARKER_TOKENS = tuple(tag for key in STATE_KEYS for tag in STATE_TAGS[key])

# The official order; appended to a 32000-token vocabulary these are ids 32000..32283.
ANIMEGAMER_TOKENS: tuple[str, ...] = (
    FRAME_TOKENS + MEDIA_TOKENS + STRENGTH_TOKENS + (VISUAL,) + STATE_MARKER_TOKENS + (TURN_START, TURN_END)
)
NUM_ANIMEGAMER_TOKENS = len(ANIMEGAMER_TOKENS)
assert NUM_ANIMEGAMER_TOKENS == 284 and len(set(ANIMEGAMER_TOKENS)) == 284

BYTE_SPECIALS = ("<unk>", "<s>", "</s>")  # ids 0, 1, 2 as in Llama/Mistral


def byte_tokenizer():
    """A small Llama-style tokenizer built offline: <unk>/<s>/</s> (ids 0..2) then the 256 bytes.

    Every byte of UTF-8 text is one token (no merges), ``<s>`` is added in front automatically as
    Llama's tokenizer does, and ``<unk>`` doubles as the pad token (as in the official tokenizer).
    For tiny random models and tests; call :func:`add_animegamer_tokens` on it like on any other.
    """
    from transformers import PreTrainedTokenizerFast

    unk, bos, eos = BYTE_SPECIALS
    vocab = {name: i for i, name in enumerate(BYTE_SPECIALS)}
    for char in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[char] = len(vocab)
    backend = Tokenizer(tokenizer_models.BPE(vocab=vocab, merges=[], unk_token=unk))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, vocab[bos])])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token=bos, eos_token=eos, unk_token=unk, pad_token=unk,
        clean_up_tokenization_spaces=False)


def load_tokenizer(path: str | None):
    """A Llama/Mistral tokenizer from a local folder, or :func:`byte_tokenizer` when ``path`` is empty.

    ``legacy=False`` is passed so that SentencePiece (Metaspace) tokenizers do not put a prefix space
    on text that follows a special token (``<TURN>Character`` -> ``Character``, not ``▁Character``):
    the official AnimeGamer tokenizer behaves this way and the official ids depend on it. Tokenizer
    classes without that option ignore it. The AnimeGamer tokens are not added here.
    """
    if not path:
        return byte_tokenizer()
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path), local_files_only=True, legacy=False)


def add_animegamer_tokens(tokenizer, say: bool = True) -> list[str]:
    """Add the AnimeGamer tokens the tokenizer lacks, in the official order; return the added names
    (``say``: log how many; a pre-flight's throwaway copy does not).

    They are added as special tokens (never split, not normalized), so a Mistral tokenizer of 32000
    gets exactly the official ids 32000..32283; the official tokenizer gets nothing.
    """
    vocab = tokenizer.get_vocab()
    missing = [name for name in ANIMEGAMER_TOKENS if name not in vocab]
    if missing:
        tokenizer.add_tokens(
            [AddedToken(name, special=True, normalized=False, lstrip=False, rstrip=False, single_word=False)
             for name in missing],
            special_tokens=True)
        if say:
            logger.info("added %d AnimeGamer tokens (vocabulary now %d)", len(missing), len(tokenizer))
    return missing


@dataclass(frozen=True)
class TokenIds:
    """Every id the sequence layout needs, looked up by name (:meth:`from_tokenizer`)."""

    bos: int
    eos: int
    pad: int
    frames: tuple[int, ...]  # <frame_00000>..<frame_00255>
    strengths: tuple[int, ...]  # <Strength_-5>..<Strength_5>
    img_start: int
    img_end: int
    vid_start: int
    vid_end: int
    frame_start: int
    frame_end: int
    visual: int
    ml_start: int
    ml_end: int
    sc_start: int
    sc_end: int
    et_start: int
    et_end: int
    st_start: int
    st_end: int
    turn_start: int
    turn_end: int

    @classmethod
    def from_tokenizer(cls, tokenizer) -> "TokenIds":
        vocab = tokenizer.get_vocab()
        missing = [name for name in ANIMEGAMER_TOKENS if name not in vocab]
        if missing:
            raise KeyError(
                f"tokenizer lacks {len(missing)} AnimeGamer tokens (e.g. {missing[:3]}): "
                "call animegamer.mllm.tokens.add_animegamer_tokens(tokenizer) first")
        for role in ("bos_token", "eos_token"):
            if getattr(tokenizer, role, None) is None:
                raise KeyError(f"tokenizer has no {role}")

        def lookup(name: str) -> int:
            return int(tokenizer.convert_tokens_to_ids(name))

        pad_token = tokenizer.pad_token if tokenizer.pad_token is not None else tokenizer.unk_token
        if pad_token is None:
            raise KeyError("tokenizer has neither a pad token nor an unk token to pad with")
        return cls(
            bos=lookup(tokenizer.bos_token), eos=lookup(tokenizer.eos_token), pad=lookup(pad_token),
            frames=tuple(lookup(n) for n in FRAME_TOKENS),
            strengths=tuple(lookup(n) for n in STRENGTH_TOKENS),
            img_start=lookup(IMG_START), img_end=lookup(IMG_END),
            vid_start=lookup(VID_START), vid_end=lookup(VID_END),
            frame_start=lookup(FRAME_START), frame_end=lookup(FRAME_END),
            visual=lookup(VISUAL),
            ml_start=lookup(ML_START), ml_end=lookup(ML_END),
            sc_start=lookup(SC_START), sc_end=lookup(SC_END),
            et_start=lookup(ET_START), et_end=lookup(ET_END),
            st_start=lookup(ST_START), st_end=lookup(ST_END),
            turn_start=lookup(TURN_START), turn_end=lookup(TURN_END),
        )

    def strength(self, k: int) -> int:
        """Id of ``<Strength_k>``, k in -5..5."""
        if isinstance(k, bool) or int(k) != k or not STRENGTH_MIN <= k <= STRENGTH_MAX:
            raise ValueError(f"strength must be an integer in [{STRENGTH_MIN}, {STRENGTH_MAX}], got {k!r}")
        return self.strengths[int(k) - STRENGTH_MIN]

    def strength_value(self, token_id: int) -> int | None:
        """The k of a ``<Strength_k>`` id, None for any other id."""
        try:
            return self.strengths.index(int(token_id)) + STRENGTH_MIN
        except ValueError:
            return None

    def frame(self, i: int) -> int:
        """Id of ``<frame_i>``, i in 0..255."""
        if not 0 <= i < NUM_FRAME_TOKENS:
            raise ValueError(f"frame index must be in [0, {NUM_FRAME_TOKENS}), got {i}")
        return self.frames[i]

    def state_tags(self, key: str) -> tuple[int, int]:
        """(open, close) ids of a state key: ML, SC, ET or ST."""
        return {MOTION_LEVEL: (self.ml_start, self.ml_end), SOCIAL: (self.sc_start, self.sc_end),
                ENTERTAINMENT: (self.et_start, self.et_end), STAMINA: (self.st_start, self.st_end)}[key]

    @property
    def reserved(self) -> frozenset[int]:
        """Every AnimeGamer id plus bos/eos: none may come out of tokenizing instruction text."""
        named = (self.img_start, self.img_end, self.vid_start, self.vid_end, self.frame_start, self.frame_end,
                 self.visual, self.ml_start, self.ml_end, self.sc_start, self.sc_end, self.et_start,
                 self.et_end, self.st_start, self.st_end, self.turn_start, self.turn_end, self.bos, self.eos)
        return frozenset(self.frames + self.strengths + named)


@torch.no_grad()
def resize_embeddings(model, tokenizer) -> int:
    """Grow the LLM's input and output embeddings to ``len(tokenizer)``; return the rows added.

    New input rows = mean of the old input rows; new output rows = 3 x mean of the old output rows
    (the official recipe). A model already at least that large is left alone (returns 0). Call it
    on the plain Hugging Face model, before any LoRA/peft wrapping.
    """
    target = len(tokenizer)
    old_in = model.get_input_embeddings().weight
    old_rows = old_in.shape[0]
    if target <= old_rows:
        return 0
    out_module = model.get_output_embeddings()
    tied = out_module is not None and out_module.weight is old_in
    in_mean = old_in.float().mean(dim=0)
    out_mean = None if out_module is None or tied else out_module.weight[:old_rows].float().mean(dim=0)
    model.resize_token_embeddings(target, mean_resizing=False)
    new_in = model.get_input_embeddings().weight
    new_in[old_rows:] = in_mean.to(new_in.dtype)
    if out_mean is not None:
        new_out = model.get_output_embeddings().weight
        new_out[old_rows:] = (NEW_OUTPUT_ROW_SCALE * out_mean).to(new_out.dtype)
    elif tied:
        logger.warning("input and output embeddings are tied: new rows get the input mean, not 3x the output mean")
    return target - old_rows
