"""Phase (b) batches: session windows, right-padded batch tensors, and the model-side scatter.

The layout logic lives here and in :mod:`animegamer.mllm.sequence` only; the model reads the batch:

=================  =================  ==========================================================
key                shape, dtype       meaning
=================  =================  ==========================================================
``input_ids``      (B, L) long        token ids, ``pad_id`` after each sequence (right padding)
``padding_mask``   (B, L) bool        True on real tokens
``position_ids``   (B, L) long        0..len-1 on real tokens (0 on left padding)
``lengths``        (B,) long          real length of each sequence
``query_mask``     (B, L) bool        the target turn's N query positions (exactly N per row)
``history_index``  (B, L) long        ``k * N + i`` at history turn k's ``<frame_i>``, -1 elsewhere
                                      (index into ``history_reps`` flattened to (B, H_max * N, D))
``history_mask``   (B, L) bool        ``history_index >= 0``
``labels``         (B, L) long        token id on the target's 12 state tokens, -100 elsewhere;
                                      aligned with ``input_ids`` (logits[:, p-1] predict labels[:, p]).
                                      Present when every item is a training sequence.
``history_reps``   (B, H_max, N, D)   reps of the history turns, oldest first, zeros past
                                      ``history_counts``; ``rep_dtype``. Present with reps.
``history_counts`` (B,) long          number of history turns of each row
``target_rep``     (B, N, D)          the regression target. Present when every item has one.
``query_index``    (S, N) long        flat positions (into the batch flattened to B * L) of the
                                      queries, sequence by sequence, each in ``<frame_i>`` order
``label_index``    (M,) long          flat positions (into B * L) of the tokens whose next token
                                      is a label, batch-major (``labels[:, 1:] != -100``'s order).
                                      Present with ``labels``
``keys``           list[str]          session keys (items with reps only)
``__skipped__``    list[dict]         bad samples the items replaced ({shard, key, reason}); only
                                      when there were some (see ``animegamer.data.indexed``)
=================  =================  ==========================================================

The model builds ``embeds = embed_tokens(input_ids)``, then
``scatter_history(embeds, input_proj(history_reps), history_index)``, the 4-D mask with
:func:`animegamer.mllm.masks.attention_mask_4d` (``query_mask``, ``padding_mask``), and reads the
predicted rep with ``gather_queries(hidden, query_mask, N)``.

The two index tensors are what the masks say, computed here on the host where reading them is free
(:func:`add_host_indices`): the model gathers with them instead of indexing with a boolean mask, whose
result size must be read back from the device, and the checks of the query counts and of
``history_index`` run here instead of in the model. A GPU training step then never waits for its data.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from animegamer.contracts.shards import SKIPPED, TURNS
from animegamer.mllm.sequence import IGNORE_INDEX, GameSequence, PromptSequence, Turn, build_sequence
from animegamer.mllm.tokens import TokenIds

QUERY_INDEX, LABEL_INDEX = "query_index", "label_index"  # batch keys of the host-computed indices


def _as_tensor(array: Any, dtype: torch.dtype | None) -> torch.Tensor:
    tensor = array if isinstance(array, torch.Tensor) else torch.from_numpy(np.asarray(array))
    return tensor if dtype is None else tensor.to(dtype)


# --------------------------------------------------------------------------- sessions and windows
@dataclass(frozen=True)
class Window:
    """Turns ``start .. start + length - 1`` of a session; the last one is the target."""

    start: int
    length: int

    @property
    def stop(self) -> int:
        return self.start + self.length

    @property
    def target(self) -> int:
        return self.start + self.length - 1


@dataclass(frozen=True)
class Session:
    """K consecutive turns of one film with their reps (K, N, D): one session-shard sample."""

    turns: Sequence[Turn]
    reps: Any  # (K, N, D) numpy array or tensor
    key: str = ""

    def __post_init__(self) -> None:
        turns = [t if isinstance(t, Turn) else Turn.from_dict(t) for t in self.turns]
        object.__setattr__(self, "turns", turns)
        shape = tuple(self.reps.shape)
        if not turns or len(shape) != 3 or shape[0] != len(turns):
            raise ValueError(f"session {self.key!r}: {len(turns)} turns need reps of shape (K, N, D) with "
                             f"K = {len(turns)} >= 1, got {shape}")

    @classmethod
    def from_record(cls, record: Mapping[str, Any], reps: Any, key: str = "") -> "Session":
        """From a session-shard sample: its ``json`` record (``turns`` list) and ``reps.npy``."""
        return cls([Turn.from_dict(t) for t in record[TURNS]], reps, key)

    def __len__(self) -> int:
        return len(self.turns)

    def window(self, window: Window) -> "Session":
        if window.length < 1 or window.start < 0 or window.stop > len(self):
            raise ValueError(f"window {window} outside a session of {len(self)} turns")
        return Session(self.turns[window.start : window.stop], self.reps[window.start : window.stop],
                       f"{self.key}@{window.start}+{window.length}" if self.key else "")


def check_window_weights(key: str, weights: Sequence[float]) -> list[str]:
    """The relative weights of window lengths 1..K (``data.window_weights``): finite, >= 0, a positive sum."""
    values = [float(w) for w in weights]
    if not values or any(not math.isfinite(w) or w < 0 for w in values) or sum(values) <= 0:
        return [f"{key}={values} must be finite and >= 0 with a positive sum"]
    return []


class WindowSampler:
    """Random training windows: length n ~ ``weights[n-1]`` (n = 1..K), then an end turn uniformly.

    Lengths longer than the session are dropped and the rest renormalised. Seeded: the same seed gives
    the same windows; give each DataLoader worker its own seed (e.g. ``seed + worker_id``).
    """

    def __init__(self, weights: Sequence[float], seed: int = 0):
        problems = check_window_weights("window weights", weights)
        if problems:
            raise ValueError(problems[0])
        self.weights = [float(w) for w in weights]
        self.reseed(seed)

    def reseed(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def length_probabilities(self, num_turns: int) -> np.ndarray:
        """P(n) for n = 1..min(K, num_turns)."""
        w = np.asarray(self.weights[: max(0, num_turns)], dtype=np.float64)
        if w.sum() <= 0:
            raise ValueError(f"no window length of positive weight fits a session of {num_turns} turns "
                             f"(weights {self.weights})")
        return w / w.sum()

    def sample(self, num_turns: int) -> Window:
        probs = self.length_probabilities(num_turns)
        length = int(self.rng.choice(len(probs), p=probs)) + 1
        end = int(self.rng.integers(length - 1, num_turns))  # the target turn, inclusive
        return Window(start=end - length + 1, length=length)

    def __call__(self, session: Session) -> Session:
        return session.window(self.sample(len(session)))


# --------------------------------------------------------------------------- examples and batches
@dataclass(frozen=True)
class Example:
    """One sequence with its reps: history (H, N, D) in turn order and the target (N, D) (None at inference)."""

    sequence: PromptSequence
    history_reps: Any
    target_rep: Any = None
    key: str = ""
    skipped: tuple = ()  # bad samples this example's session replaced: ({shard, key, reason}, ...)

    def __post_init__(self) -> None:
        n, h = self.sequence.num_query_tokens, self.sequence.num_history
        shape = tuple(self.history_reps.shape)
        if len(shape) != 3 or shape[:2] != (h, n):
            raise ValueError(f"history_reps must be ({h}, {n}, D), got {shape}")
        if self.target_rep is not None and tuple(self.target_rep.shape) != (n, shape[2]):
            raise ValueError(f"target_rep must be ({n}, {shape[2]}), got {tuple(self.target_rep.shape)}")


def make_example(ids: TokenIds, tokenizer, session: Session) -> Example:
    """The training example of a window (a :class:`Session`, e.g. from :class:`WindowSampler`):
    every turn but the last is history, the last is the target; N is the reps' second dimension."""
    sequence = build_sequence(ids, tokenizer, session.turns, num_query_tokens=int(session.reps.shape[1]))
    return Example(sequence, session.reps[:-1], session.reps[-1], session.key)


def round_up(length: int, multiple: int | None) -> int:
    """``length`` rounded up to a multiple of ``multiple`` (unchanged for 0 / None)."""
    return -(-length // multiple) * multiple if multiple else length


def padded_token_fields(rows: int, width: int, pad_id: int) -> dict[str, torch.Tensor]:
    """The (rows, width) per-token tensors of a batch, every position holding its padding value."""
    shape = (rows, width)
    return {"input_ids": torch.full(shape, int(pad_id), dtype=torch.long),
            "padding_mask": torch.zeros(shape, dtype=torch.bool),
            "position_ids": torch.zeros(shape, dtype=torch.long),
            "query_mask": torch.zeros(shape, dtype=torch.bool),
            "history_index": torch.full(shape, -1, dtype=torch.long),
            "labels": torch.full(shape, IGNORE_INDEX, dtype=torch.long)}


def place_sequence(fields: dict[str, torch.Tensor], row: int, span: slice, seq, history_offset: int = 0,
                   with_labels: bool = True) -> None:
    """Write one sequence's tokens into ``fields[key][row, span]``: positions restart at 0, and its
    history indices (``k * N + i`` within the sequence) are shifted by ``history_offset`` rows."""
    fields["input_ids"][row, span] = torch.tensor(seq.input_ids, dtype=torch.long)
    fields["padding_mask"][row, span] = True
    fields["position_ids"][row, span] = torch.arange(len(seq))
    fields["query_mask"][row, span] = torch.tensor(seq.query_mask, dtype=torch.bool)
    local = torch.tensor(seq.history_index, dtype=torch.long)
    fields["history_index"][row, span] = torch.where(local >= 0, local + history_offset, local)
    if with_labels:
        fields["labels"][row, span] = torch.tensor(seq.labels, dtype=torch.long)


def stack_histories(histories: Sequence[torch.Tensor], n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row history reps (H_r, N, D) -> zero-padded (R, H_max, N, D) and the counts H_r (R,)."""
    dim = histories[0].shape[-1]
    if any(h.shape[-1] != dim for h in histories):
        raise ValueError("examples disagree on the rep width D")
    counts = [h.shape[0] for h in histories]
    reps = torch.zeros((len(histories), max(counts), n, dim), dtype=histories[0].dtype)
    for row, history in enumerate(histories):
        reps[row, : history.shape[0]] = history
    return reps, torch.tensor(counts, dtype=torch.long)


def collate_sequences(items: Sequence[Example | PromptSequence], pad_id: int, *,
                      pad_to_multiple_of: int | None = None, padding_side: str = "right",
                      rep_dtype: torch.dtype | None = torch.float32) -> dict[str, Any]:
    """Pad a list of :class:`Example` (or bare sequences) into the batch dict of this module's docstring.

    ``labels`` are present when every sequence is a :class:`GameSequence`, ``history_reps`` /
    ``history_counts`` / ``keys`` when every item is an :class:`Example`, ``target_rep`` when moreover
    every example has one. ``padding_side='left'`` is for batched generation; training uses right.
    """
    if not items:
        raise ValueError("cannot collate an empty list")
    if padding_side not in ("right", "left"):
        raise ValueError(f"padding_side must be 'right' or 'left', got {padding_side!r}")
    examples = [item if isinstance(item, Example) else None for item in items]
    sequences = [item.sequence if isinstance(item, Example) else item for item in items]
    n = sequences[0].num_query_tokens
    if any(s.num_query_tokens != n for s in sequences):
        raise ValueError(f"sequences disagree on num_query_tokens: {sorted({s.num_query_tokens for s in sequences})}")
    lengths = [len(s) for s in sequences]
    width = round_up(max(lengths), pad_to_multiple_of)
    batch = len(items)
    training = all(isinstance(s, GameSequence) for s in sequences)
    out: dict[str, Any] = padded_token_fields(batch, width, pad_id)
    for row, (seq, length) in enumerate(zip(sequences, lengths)):
        span = slice(0, length) if padding_side == "right" else slice(width - length, width)
        place_sequence(out, row, span, seq, with_labels=training)
    if not training:
        del out["labels"]
    out.update(lengths=torch.tensor(lengths, dtype=torch.long), history_mask=out["history_index"] >= 0)
    if all(e is not None for e in examples):
        reps, counts = stack_histories([_as_tensor(e.history_reps, rep_dtype) for e in examples], n)
        out.update(history_reps=reps, history_counts=counts, keys=[e.key for e in examples])
        if all(e.target_rep is not None for e in examples):
            out["target_rep"] = torch.stack([_as_tensor(e.target_rep, rep_dtype) for e in examples])
    skipped = [record for e in examples if e is not None for record in e.skipped]
    if skipped:
        out[SKIPPED] = skipped
    return add_host_indices(out, n)


# --------------------------------------------------------------------------- checks and host indices
def query_counts(query_mask: torch.Tensor, document_ids: torch.Tensor | None = None) -> torch.Tensor:
    """Query positions per row (B,), or per packed sequence (S,) with ``document_ids`` (-1 on padding)."""
    if document_ids is None:
        return query_mask.sum(dim=1)
    owners = document_ids[query_mask.bool()]
    if owners.numel() and int(owners.min()) < 0:
        raise ValueError("a query position lies on padding (document_ids -1) of a packed batch")
    return torch.bincount(owners, minlength=int(document_ids.max()) + 1)


def check_query_counts(query_mask: torch.Tensor, n: int, document_ids: torch.Tensor | None = None) -> None:
    """ValueError unless every row, or every packed sequence with ``document_ids``, has exactly ``n`` queries."""
    counts = query_counts(query_mask, document_ids)
    if not bool((counts == n).all()):
        unit = "sample" if document_ids is None else "packed sequence"
        raise ValueError(f"every {unit} needs exactly {n} query positions, got {counts.tolist()}")


def check_history_index(history_index: torch.Tensor, rows: int) -> None:
    """ValueError when ``history_index`` points past a sample's ``rows`` (H_max * N) history rows."""
    if history_index.numel() and int(history_index.max()) >= rows:
        raise ValueError(f"history_index points past the {rows} history rows of a sample")


def add_host_indices(batch: dict[str, Any], n: int) -> dict[str, Any]:
    """Check a collated batch (query counts, ``history_index``) and add ``query_index`` and, with
    labels, ``label_index`` (this module's docstring). Host tensors: nothing here waits for a device."""
    query_mask = batch["query_mask"]
    check_query_counts(query_mask, n, batch.get("document_ids"))
    if "history_reps" in batch:
        check_history_index(batch["history_index"], batch["history_reps"].shape[1] * n)
    # nonzero walks the flattened batch in row-major order: the order of a boolean-mask index
    batch[QUERY_INDEX] = query_mask.flatten().nonzero().squeeze(1).reshape(-1, n)  # (S * N,) -> (S, N)
    if "labels" in batch:
        rows, columns = (batch["labels"][:, 1:] != IGNORE_INDEX).nonzero(as_tuple=True)
        batch[LABEL_INDEX] = rows * query_mask.shape[1] + columns  # row b, column t -> b * L + t
    return batch


# --------------------------------------------------------------------------- model-side helpers
def scatter_history(embeds: torch.Tensor, history_reps_projected: torch.Tensor,
                    history_index: torch.Tensor) -> torch.Tensor:
    """Put history rep rows at their frame positions: ``out[b, p] = reps[b, k, i]`` where
    ``history_index[b, p] = k * N + i``, ``embeds[b, p]`` where it is -1.

    ``embeds`` (B, L, H); ``history_reps_projected`` (B, H_max, N, H) (``input_proj`` already applied)
    or already flat (B, H_max * N, H); ``history_index`` (B, L) long. Differentiable in both inputs;
    returns a new tensor in ``embeds``' dtype.
    """
    batch, length, hidden = embeds.shape
    flat = history_reps_projected.reshape(batch, -1, hidden)
    if history_index.shape != (batch, length):
        raise ValueError(f"history_index must be {(batch, length)}, got {tuple(history_index.shape)}")
    if flat.shape[1] == 0:  # no history in the whole batch
        return embeds
    index = history_index.clamp(min=0).unsqueeze(-1).expand(batch, length, hidden)
    gathered = torch.gather(flat.to(embeds.dtype), 1, index)
    return torch.where((history_index >= 0).unsqueeze(-1), gathered, embeds)


def gather_queries(hidden: torch.Tensor, query_mask: torch.Tensor, num_query_tokens: int) -> torch.Tensor:
    """(S, N, H) hidden states at the query positions, in order: S = B, one sequence per row, or the
    number of sequences of a packed batch (N query positions each, row by row)."""
    return hidden[query_mask.bool()].reshape(-1, num_query_tokens, hidden.shape[-1])


def gather_flat(values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``values`` (B, L, ...) at the flat positions ``index`` (any shape) of its first two dimensions:
    shape ``index.shape + values.shape[2:]``, e.g. ``hidden`` at ``query_index`` (S, N) -> (S, N, H).

    What a boolean mask gives, in the same order, with the size known on the host: no device read.
    """
    flat = values.flatten(0, 1)  # (B, L, ...) -> (B * L, ...): a view, no copy, of a contiguous tensor
    return flat.index_select(0, index.flatten()).reshape(*index.shape, *values.shape[2:])
