"""Game-state sequences: the official token layout, for training and inference.

A sequence is ``<s>`` then one block per turn, history turns first, the target turn last::

    <TURN>{instruction}<img><frame><frame_00000>...<frame_{N-1}></frame></img>
    <ML><Strength_m></ML><SC><Strength_s></SC><ET><Strength_e></ET><ST><Strength_t></ST></TURN>

Positions (0-based, within the whole sequence) that the model needs come with it:

- ``history_turn[p] = k`` on the N frame-token positions of history turn k (0-based, oldest first),
  -1 elsewhere: those positions hold ``input_proj(rep_k)`` instead of token embeddings, row i of the
  rep at the position of ``<frame_i>`` (``history_index[p] = k * N + i`` is the flat form);
- ``query_mask[p]``: the target turn's N frame-token positions (the queries; they keep the embeddings
  of ``<frame_i>`` and attend to each other both ways);
- ``labels[p]`` (training only): the token id on the target's 12 state tokens, from ``<Strength_m>``
  after ``<ML>`` through ``</TURN>``, -100 elsewhere. Labels are aligned with ``input_ids`` (Hugging
  Face convention): the logits at position p - 1 predict ``labels[p]``.

Instruction text is tokenized in its context, as ``<TURN>{instruction}<img>`` with the two markers
removed afterwards: SentencePiece tokenizers (with ``legacy=False``, as the official one) then put no
prefix space on text after a special token, which is what the official ids hold. The same ids come out
of tokenizing the whole sequence string at once.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from animegamer.contracts.shards import INSTRUCTION, STATES
from animegamer.contracts.states import ML_RANGE, MOTION_LEVEL, STATE_KEYS
from animegamer.mllm.tokens import (
    ANIMEGAMER_TOKENS,
    IMG_START,
    NUM_FRAME_TOKENS,
    STRENGTH_MAX,
    STRENGTH_MIN,
    TURN_START,
    TokenIds,
)

MALFORMED = "malformed state generation"  # what a state generation outside the layout is called

IGNORE_INDEX = -100  # labels not in the loss (torch cross_entropy's default ignore_index)
STATE_RANGE = (STRENGTH_MIN, STRENGTH_MAX)  # SC, ET, ST (usually SC/ET in {0, 1}, ST in {-1, +1})
NUM_STATE_TOKENS = 12  # <Strength_m></ML><SC><Strength_s></SC><ET><Strength_e></ET><ST><Strength_t></ST></TURN>


def _as_int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not hasattr(value, "__index__") and not (
            isinstance(value, float) and value.is_integer()):
        raise ValueError(f"{what} must be an integer, got {value!r}")
    return int(value)


@dataclass(frozen=True)
class Turn:
    """One game turn: the instruction and its four state values ML (1..5), SC, ET, ST (-5..5)."""

    instruction: str
    states: Mapping[str, int] = field(hash=False)

    def __post_init__(self) -> None:
        if not isinstance(self.instruction, str):
            raise ValueError(f"instruction must be a string, got {type(self.instruction).__name__}")
        if not isinstance(self.states, Mapping) or set(self.states) != set(STATE_KEYS):
            raise ValueError(f"states must have exactly the keys {STATE_KEYS}, got {self.states!r}")
        clean = {}
        for key in STATE_KEYS:
            value = _as_int(self.states[key], f"state {key}")
            low, high = ML_RANGE if key == MOTION_LEVEL else STATE_RANGE
            if not low <= value <= high:
                raise ValueError(f"state {key} must be in [{low}, {high}], got {value}")
            clean[key] = value
        object.__setattr__(self, "states", clean)

    @classmethod
    def from_dict(cls, record: Mapping[str, Any]) -> "Turn":
        """From a session-shard / game-file turn record (extra keys such as ``key``, ``flow`` ignored)."""
        return cls(instruction=record[INSTRUCTION], states=dict(record[STATES]))

    def to_dict(self) -> dict:
        return {INSTRUCTION: self.instruction, STATES: dict(self.states)}


@dataclass(frozen=True)
class PromptSequence:
    """An inference prompt: history turns, then the target turn up to and including ``<ML>``."""

    input_ids: list[int]
    query_mask: list[bool]  # the target turn's N frame-token positions
    history_turn: list[int]  # k on history turn k's frame positions, -1 elsewhere
    num_query_tokens: int  # N
    turn_starts: list[int]  # position of each turn's <TURN> (history turns, then the target)
    frame_starts: list[int]  # position of each turn's <frame_00000>; the last is the target's

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def num_history(self) -> int:
        return len(self.turn_starts) - 1

    @property
    def history_mask(self) -> list[bool]:
        """Positions that hold ``input_proj(rep)`` of a history turn (the official ``history_mask``)."""
        return [k >= 0 for k in self.history_turn]

    @property
    def history_index(self) -> list[int]:
        """Flat form of ``history_turn``: ``k * N + i`` at history turn k's ``<frame_i>``, -1 elsewhere."""
        n = self.num_query_tokens
        out = [-1] * len(self.input_ids)
        for k, start in enumerate(self.frame_starts[:-1]):
            out[start : start + n] = range(k * n, (k + 1) * n)
        return out

    @property
    def query_positions(self) -> list[int]:
        """The N target query positions in order (``<frame_00000>`` first)."""
        start = self.frame_starts[-1]
        return list(range(start, start + self.num_query_tokens))


@dataclass(frozen=True)
class GameSequence(PromptSequence):
    """A training window: history turns and the complete target turn, with labels."""

    labels: list[int]  # token id on the target's 12 state tokens, IGNORE_INDEX elsewhere
    label_start: int  # first supervised position (the <Strength_m> after the target's <ML>)


def encode_instruction(ids: TokenIds, tokenizer, instruction: str) -> list[int]:
    """The ids of ``instruction`` as they appear between ``<TURN>`` and ``<img>``."""
    if not isinstance(instruction, str):
        raise ValueError(f"instruction must be a string, got {type(instruction).__name__}")
    encoded = list(tokenizer(TURN_START + instruction + IMG_START, add_special_tokens=False)["input_ids"])
    if len(encoded) < 2 or encoded[0] != ids.turn_start or encoded[-1] != ids.img_start:
        raise ValueError(f"tokenizer does not keep {TURN_START} / {IMG_START} whole around {instruction!r}")
    text = encoded[1:-1]
    reserved = ids.reserved
    if any(t in reserved for t in text):
        raise ValueError(f"instruction {instruction!r} contains reserved tokens (<s>, </s> or AnimeGamer tokens)")
    return text


def _check_num_query_tokens(n: int) -> int:
    n = _as_int(n, "num_query_tokens")
    if not 1 <= n <= NUM_FRAME_TOKENS:
        raise ValueError(f"num_query_tokens must be in [1, {NUM_FRAME_TOKENS}], got {n}")
    return n


def state_ids(ids: TokenIds, states: Mapping[str, int]) -> list[int]:
    """The 12 state tokens that follow ``<ML>``: ``<Strength_m></ML><SC>...</ST></TURN>``."""
    out = [ids.strength(states[MOTION_LEVEL]), ids.ml_end]
    for key in STATE_KEYS[1:]:
        open_id, close_id = ids.state_tags(key)
        out += [open_id, ids.strength(states[key]), close_id]
    return out + [ids.turn_end]


class _Builder:
    def __init__(self, ids: TokenIds, tokenizer, num_query_tokens: int):
        self.ids, self.tokenizer = ids, tokenizer
        self.n = _check_num_query_tokens(num_query_tokens)
        self.input_ids: list[int] = [ids.bos]
        self.history_turn: list[int] = [-1]
        self.query_mask: list[bool] = [False]
        self.turn_starts: list[int] = []
        self.frame_starts: list[int] = []

    def _extend(self, tokens: Sequence[int], history: int = -1, query: bool = False) -> None:
        self.input_ids += tokens
        self.history_turn += [history] * len(tokens)
        self.query_mask += [query] * len(tokens)

    def turn(self, instruction: str, states: Mapping[str, int] | None, history: int) -> None:
        """One turn; ``history`` = k for history turn k, -1 for the target; no states = stop after <ML>."""
        ids = self.ids
        self.turn_starts.append(len(self.input_ids))
        self._extend([ids.turn_start] + encode_instruction(ids, self.tokenizer, instruction)
                     + [ids.img_start, ids.frame_start])
        self.frame_starts.append(len(self.input_ids))
        self._extend(list(ids.frames[: self.n]), history=history, query=history < 0)
        self._extend([ids.frame_end, ids.img_end, ids.ml_start])
        if states is not None:
            self._extend(state_ids(ids, states))

    def fields(self) -> dict:
        return dict(input_ids=self.input_ids, query_mask=self.query_mask, history_turn=self.history_turn,
                    num_query_tokens=self.n, turn_starts=self.turn_starts, frame_starts=self.frame_starts)


def _turns(turns: Iterable[Turn | Mapping]) -> list[Turn]:
    return [t if isinstance(t, Turn) else Turn.from_dict(t) for t in turns]


def build_sequence(ids: TokenIds, tokenizer, turns: Sequence[Turn], num_query_tokens: int) -> GameSequence:
    """The training sequence of a window: every turn but the last is history, the last is the target."""
    turns = _turns(turns)
    if not turns:
        raise ValueError("a training window needs at least one turn (the target)")
    builder = _Builder(ids, tokenizer, num_query_tokens)
    for k, turn in enumerate(turns[:-1]):
        builder.turn(turn.instruction, turn.states, history=k)
    builder.turn(turns[-1].instruction, turns[-1].states, history=-1)
    label_start = len(builder.input_ids) - NUM_STATE_TOKENS
    labels = [IGNORE_INDEX] * label_start + builder.input_ids[label_start:]
    return GameSequence(**builder.fields(), labels=labels, label_start=label_start)


def build_prompt(ids: TokenIds, tokenizer, history: Sequence[Turn], instruction: str,
                 num_query_tokens: int) -> PromptSequence:
    """The inference prompt: complete history turns, then the new turn up to and including ``<ML>``.

    Greedy generation continues it with the 12 state tokens (:func:`parse_states`); the hidden states
    at ``query_positions`` of one forward pass over it give the predicted representation.
    """
    builder = _Builder(ids, tokenizer, num_query_tokens)
    for k, turn in enumerate(_turns(history)):
        builder.turn(turn.instruction, turn.states, history=k)
    builder.turn(instruction, None, history=-1)
    return PromptSequence(**builder.fields())


def describe_ids(ids: TokenIds, token_ids: Iterable[int], tokenizer=None) -> str:
    """Readable text of ids: the tokenizer's decoding, or AnimeGamer names and ``[id]`` for the rest."""
    token_ids = [int(t) for t in token_ids]
    if tokenizer is not None:
        return tokenizer.decode(token_ids, skip_special_tokens=False)
    names = dict(zip(ids.frames, ANIMEGAMER_TOKENS))
    names.update({ids.strength(k): f"<Strength_{k}>" for k in range(STRENGTH_MIN, STRENGTH_MAX + 1)})
    names.update({ids.img_start: "<img>", ids.img_end: "</img>", ids.frame_start: "<frame>",
                  ids.frame_end: "</frame>", ids.visual: "<visual>", ids.vid_start: "<vid>", ids.vid_end: "</vid>",
                  ids.turn_start: "<TURN>", ids.turn_end: "</TURN>", ids.bos: "<s>", ids.eos: "</s>"})
    for key in STATE_KEYS:
        open_id, close_id = ids.state_tags(key)
        names.update({open_id: f"<{key}>", close_id: f"</{key}>"})
    return "".join(names.get(t, f"[{t}]") for t in token_ids)


def parse_states(ids: TokenIds, generated_ids: Iterable[int], tokenizer=None) -> dict[str, int]:
    """The states of a generation that continues a prompt ending in ``<ML>``.

    The first 12 generated ids must be exactly ``<Strength_m></ML><SC><Strength_s></SC><ET>
    <Strength_e></ET><ST><Strength_t></ST></TURN>`` with ML in 1..5; anything after ``</TURN>`` (e.g.
    padding of a batched generation) is ignored. Anything else raises ValueError with the decoded text
    (``tokenizer`` decodes it when given): a malformed generation never turns into default states.
    """
    if hasattr(generated_ids, "tolist"):
        generated_ids = generated_ids.tolist()
    generated = [int(t) for t in generated_ids]
    head = generated[:NUM_STATE_TOKENS]

    def fail(why: str):
        text = describe_ids(ids, generated, tokenizer)
        return ValueError(f"{MALFORMED} ({why}): {text!r}")

    if len(head) < NUM_STATE_TOKENS:
        raise fail(f"{len(head)} tokens, expected {NUM_STATE_TOKENS}")
    states: dict[str, int] = {}
    slots = {3 * i: key for i, key in enumerate(STATE_KEYS)}  # offsets of the <Strength_k> tokens
    template = state_ids(ids, {key: 0 if key != MOTION_LEVEL else ML_RANGE[0] for key in STATE_KEYS})
    for pos, (got, want) in enumerate(zip(head, template)):
        if pos in slots:
            value = ids.strength_value(got)
            if value is None:
                raise fail(f"token {pos} is not a <Strength_k> token for {slots[pos]}")
            states[slots[pos]] = value
        elif got != want:
            raise fail(f"token {pos} is not {describe_ids(ids, [want])}")
    if not ML_RANGE[0] <= states[MOTION_LEVEL] <= ML_RANGE[1]:
        raise fail(f"motion level {states[MOTION_LEVEL]} outside {ML_RANGE[0]}..{ML_RANGE[1]}")
    return {key: states[key] for key in STATE_KEYS}
