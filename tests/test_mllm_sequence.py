"""The phase (b) token layout, masks and batches (animegamer.mllm) against docs/architecture.md and the
official golden sequence (../shared/reference/official_mllm_golden/case.json)."""
from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from animegamer.mllm import collate as C
from animegamer.mllm import masks as M
from animegamer.mllm import packing as P
from animegamer.mllm import sequence as S
from animegamer.mllm import tokens as T

REFERENCE = Path(__file__).resolve().parents[2] / "shared" / "reference"
OFFICIAL_TOKENIZER = REFERENCE / "animegamer_tokenizer"
GOLDEN = REFERENCE / "official_mllm_golden" / "case.json"
needs_official = pytest.mark.skipif(not OFFICIAL_TOKENIZER.is_dir() or not GOLDEN.is_file(),
                                    reason="official tokenizer / golden case not present")

STATES = [{"ML": 1, "SC": 1, "ET": 0, "ST": 1}, {"ML": 2, "SC": 0, "ET": 0, "ST": -1},
          {"ML": 3, "SC": 1, "ET": 1, "ST": -1}, {"ML": 5, "SC": 0, "ET": 1, "ST": 1},
          {"ML": 4, "SC": -5, "ET": 5, "ST": 0}]


def make_turns(count: int) -> list[S.Turn]:
    return [S.Turn(f"Character: Kiki {i}; Motion: fly; Background: night sky, héllo.", STATES[i % 5])
            for i in range(count)]


# --------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def official():
    tok = T.load_tokenizer(str(OFFICIAL_TOKENIZER))
    assert T.add_animegamer_tokens(tok) == []
    return tok, T.TokenIds.from_tokenizer(tok)


@pytest.fixture(scope="module")
def golden():
    return json.loads(GOLDEN.read_text())


@pytest.fixture(scope="module")
def byte():
    tok = T.byte_tokenizer()
    base = len(tok)
    added = T.add_animegamer_tokens(tok)
    assert added == list(T.ANIMEGAMER_TOKENS) and len(tok) == base + 284
    return tok, T.TokenIds.from_tokenizer(tok)


# --------------------------------------------------------------------------- tokens
def test_token_names_in_official_order():
    names = T.ANIMEGAMER_TOKENS
    assert len(names) == 284 == T.NUM_ANIMEGAMER_TOKENS
    assert names[0] == "<frame_00000>" and names[255] == "<frame_00255>"
    assert names[256:262] == ("<img>", "</img>", "<vid>", "</vid>", "<frame>", "</frame>")
    assert names[262] == "<Strength_-5>" and names[272] == "<Strength_5>" and names[273] == "<visual>"
    assert names[274:] == ("<ML>", "</ML>", "<SC>", "</SC>", "<ET>", "</ET>", "<ST>", "</ST>", "<TURN>", "</TURN>")


@needs_official
def test_official_ids_by_name(official):
    tok, ids = official
    assert len(tok) == 32284
    for offset, name in enumerate(T.ANIMEGAMER_TOKENS):
        assert tok.convert_tokens_to_ids(name) == 32000 + offset, name
    assert ids.frame(0) == 32000 and ids.frame(255) == 32255 and ids.strength(-5) == 32262
    assert ids.strength(5) == 32272 and ids.turn_end == 32283 and ids.bos == 1


@needs_official
def test_plain_mistral_tokenizer_gets_official_ids(tmp_path, golden):
    """A 32000-token Mistral folder (even one saying legacy=True) + the added tokens = the official format."""
    shutil.copy(OFFICIAL_TOKENIZER / "tokenizer.model", tmp_path)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "LlamaTokenizer", "legacy": True, "bos_token": "<s>", "eos_token": "</s>",
         "unk_token": "<unk>", "add_bos_token": True}))
    tok = T.load_tokenizer(str(tmp_path))
    assert len(tok) == 32000
    assert T.add_animegamer_tokens(tok) == list(T.ANIMEGAMER_TOKENS)
    ids = T.TokenIds.from_tokenizer(tok)
    assert [tok.convert_tokens_to_ids(n) for n in T.ANIMEGAMER_TOKENS] == list(range(32000, 32284))
    seq = S.build_sequence(ids, tok, [S.Turn.from_dict(t) for t in golden["turns"]], golden["num_query_tokens"])
    assert seq.input_ids == golden["input_ids"]


def test_token_ids_missing_token_is_clear():
    with pytest.raises(KeyError, match="add_animegamer_tokens"):
        T.TokenIds.from_tokenizer(T.byte_tokenizer())


def test_token_id_helpers(byte):
    tok, ids = byte
    assert ids.strength(-5) == tok.convert_tokens_to_ids("<Strength_-5>")
    assert ids.strength(0) == tok.convert_tokens_to_ids("<Strength_0>")
    assert ids.frame(17) == tok.convert_tokens_to_ids("<frame_00017>")
    assert ids.strength_value(ids.strength(-3)) == -3 and ids.strength_value(ids.turn_end) is None
    for bad in (6, -6, True):
        with pytest.raises(ValueError):
            ids.strength(bad)
    with pytest.raises(ValueError):
        ids.frame(256)
    assert T.add_animegamer_tokens(tok) == []  # idempotent


def test_byte_tokenizer_adds_bos_and_never_splits_added_tokens(byte):
    tok, ids = byte
    enc = tok("ab<TURN>c<frame_00003>")["input_ids"]
    assert enc[0] == ids.bos and enc.count(ids.bos) == 1
    assert ids.turn_start in enc and ids.frame(3) in enc
    assert tok.decode(tok("héllo wörld", add_special_tokens=False)["input_ids"]) == "héllo wörld"


# --------------------------------------------------------------------------- golden sequence
@needs_official
def test_golden_sequence_reproduced(official, golden):
    tok, ids = official
    turns = [S.Turn.from_dict(t) for t in golden["turns"]]
    seq = S.build_sequence(ids, tok, turns, golden["num_query_tokens"])
    assert seq.input_ids == golden["input_ids"]
    assert seq.query_mask == golden["query_mask"]
    assert seq.history_mask == golden["history_mask"]
    assert seq.label_start == golden["labels_from_index"]
    start = golden["labels_from_index"]
    assert seq.labels == [S.IGNORE_INDEX] * start + golden["input_ids"][start:]
    assert seq.num_history == golden["target_turn"] == 2
    # history turn k's frames hold rep k, in frame order, turn by turn
    n = golden["num_query_tokens"]
    hist = [p for p, k in enumerate(seq.history_turn) if k >= 0]
    assert [seq.history_turn[p] for p in hist] == [0] * n + [1] * n
    assert [seq.history_index[p] for p in hist] == list(range(2 * n))
    # one call on the whole string gives the same ids: the instruction tokenization is in context
    text = tok.decode(seq.input_ids[1:], skip_special_tokens=False)
    assert tok(text)["input_ids"] == seq.input_ids
    assert S.parse_states(ids, seq.input_ids[seq.label_start:], tok) == turns[-1].states


@needs_official
@pytest.mark.parametrize("count", [1, 5])
def test_official_sequence_sanity(official, count):
    tok, ids = official
    n = 226
    seq = S.build_sequence(ids, tok, make_turns(count), n)
    frames = Counter(t for t in seq.input_ids if t in set(ids.frames))
    assert seq.input_ids.count(ids.bos) == 1 and seq.input_ids[0] == ids.bos
    assert all(frames[ids.frame(i)] == count for i in range(n)) and ids.frame(n) not in frames
    assert sum(seq.query_mask) == n and sum(seq.history_mask) == (count - 1) * n
    assert seq.input_ids.count(ids.turn_start) == count == seq.input_ids.count(ids.turn_end)
    assert sum(lab != S.IGNORE_INDEX for lab in seq.labels) == 12
    assert seq.input_ids[-1] == ids.turn_end


# --------------------------------------------------------------------------- layout (byte tokenizer)
def expected_layout(ids, tok, turns, n, prompt=False):
    """An independent spelling of the layout (docs/architecture.md) as one token-name string, tokenized at once."""
    def block(turn, with_states):
        s = f"<TURN>{turn.instruction}<img><frame>" + "".join(f"<frame_{i:05d}>" for i in range(n))
        s += "</frame></img><ML>"
        if with_states:
            st = turn.states
            s += (f"<Strength_{st['ML']}></ML><SC><Strength_{st['SC']}></SC><ET><Strength_{st['ET']}></ET>"
                  f"<ST><Strength_{st['ST']}></ST></TURN>")
        return s
    text = "".join(block(t, True) for t in turns[:-1]) + block(turns[-1], not prompt)
    return tok(text)["input_ids"]


@pytest.mark.parametrize("count", [1, 3])
def test_layout_markers(byte, count):
    tok, ids = byte
    n = 7
    turns = make_turns(count)
    seq = S.build_sequence(ids, tok, turns, n)
    assert seq.input_ids == expected_layout(ids, tok, turns, n)
    text_len = len(tok(turns[0].instruction, add_special_tokens=False)["input_ids"])
    block = 1 + text_len + 2 + n + 3 + 12
    assert len(seq) == 1 + count * block
    for k in range(count):
        start = 1 + k * block
        assert seq.turn_starts[k] == start and seq.input_ids[start] == ids.turn_start
        f = seq.frame_starts[k]
        assert f == start + 1 + text_len + 2
        assert seq.input_ids[f - 2 : f] == [ids.img_start, ids.frame_start]
        assert seq.input_ids[f : f + n] == [ids.frame(i) for i in range(n)]
        assert seq.input_ids[f + n : f + n + 3] == [ids.frame_end, ids.img_end, ids.ml_start]
        expect_hist = k if k < count - 1 else -1
        assert seq.history_turn[f : f + n] == [expect_hist] * n
        assert seq.query_mask[f : f + n] == [k == count - 1] * n
    assert sum(seq.query_mask) == n and sum(seq.history_mask) == (count - 1) * n
    assert seq.label_start == len(seq) - 12 and seq.input_ids[seq.label_start - 1] == ids.ml_start
    assert all(lab == S.IGNORE_INDEX for lab in seq.labels[: seq.label_start])
    assert seq.labels[seq.label_start :] == seq.input_ids[seq.label_start :]


def test_prompt_ends_in_ml(byte):
    tok, ids = byte
    turns = make_turns(3)
    n = 5
    prompt = S.build_prompt(ids, tok, turns[:-1], turns[-1].instruction, n)
    full = S.build_sequence(ids, tok, turns, n)
    assert prompt.input_ids[-1] == ids.ml_start
    assert prompt.input_ids == full.input_ids[: full.label_start] == expected_layout(ids, tok, turns, n, prompt=True)
    assert prompt.query_mask == full.query_mask[: len(prompt)]
    assert prompt.history_turn == full.history_turn[: len(prompt)]
    assert prompt.query_positions == [p for p, q in enumerate(prompt.query_mask) if q]
    assert prompt.query_positions[-1] == len(prompt) - 4  # not the last N positions (the official bug)
    assert S.build_prompt(ids, tok, [], "hi", n).num_history == 0


def test_parse_states_round_trip_and_malformed(byte):
    tok, ids = byte
    for states in STATES:
        generated = S.state_ids(ids, states)
        assert S.parse_states(ids, generated, tok) == states
        assert S.parse_states(ids, torch.tensor(generated + [ids.eos, 0, 0])) == states  # tail ignored
    good = S.state_ids(ids, STATES[2])
    bad_cases = [
        good[:-1],  # truncated
        [ids.ml_end] + good[1:],  # no value
        good[:1] + [ids.sc_start] + good[2:],  # wrong marker
        good[:3] + [ids.frame(0)] + good[4:],  # not a strength token
        good[:-1] + [ids.eos],  # no </TURN>
        S.state_ids(ids, STATES[0])[:0] + [ids.strength(0)] + good[1:],  # ML 0 is outside 1..5
        tok("The states are fine.", add_special_tokens=False)["input_ids"],
    ]
    for bad in bad_cases:
        with pytest.raises(ValueError, match="malformed") as err:
            S.parse_states(ids, bad, tok)
        assert tok.decode(bad, skip_special_tokens=False) in str(err.value)
    with pytest.raises(ValueError, match=r"\[3\]"):  # without a tokenizer: names and raw ids
        S.parse_states(ids, [ids.strength(1), 3])


def test_turn_validation():
    with pytest.raises(ValueError):
        S.Turn("x", {"ML": 0, "SC": 0, "ET": 0, "ST": 1})
    with pytest.raises(ValueError):
        S.Turn("x", {"ML": 1, "SC": 0, "ET": 0})
    with pytest.raises(ValueError):
        S.Turn("x", {"ML": 1, "SC": 6, "ET": 0, "ST": 1})
    with pytest.raises(ValueError):
        S.Turn("x", {"ML": 1.5, "SC": 0, "ET": 0, "ST": 1})
    turn = S.Turn.from_dict({"key": "f-000001", "flow": 3.2, "instruction": "x",
                             "states": {"ML": np.int64(2), "SC": 0, "ET": 1, "ST": -1}})
    assert turn.states == {"ML": 2, "SC": 0, "ET": 1, "ST": -1} and type(turn.states["ML"]) is int


def test_reserved_text_and_bad_sizes_rejected(byte):
    tok, ids = byte
    with pytest.raises(ValueError, match="reserved"):
        S.build_sequence(ids, tok, [S.Turn("jump <ML> now", STATES[0])], 4)
    with pytest.raises(ValueError):
        S.build_sequence(ids, tok, make_turns(1), 257)
    with pytest.raises(ValueError):
        S.build_sequence(ids, tok, [], 4)


# --------------------------------------------------------------------------- masks
def rule(i, j, query, valid):
    """The attention rule, written independently: causal; the query block both ways; padded keys blocked;
    a padded query row attends to itself only."""
    if not valid[i]:
        return i == j
    if not valid[j]:
        return False
    return j <= i or (query[i] and query[j])


def small_batch():
    query = torch.zeros(3, 12, dtype=torch.bool)
    valid = torch.ones(3, 12, dtype=torch.bool)
    query[0, 3:7] = True  # full length
    query[1, 2:5] = True
    valid[1, 9:] = False  # right padding
    query[2, 1:3] = True
    valid[2, 5:] = False
    return query, valid


def test_attention_mask_rule_every_pair():
    query, valid = small_batch()
    allowed = M.allowed_matrix(query, valid)
    for b in range(3):
        for i in range(12):
            for j in range(12):
                assert bool(allowed[b, i, j]) == rule(i, j, query[b].tolist(), valid[b].tolist()), (b, i, j)
    for dtype in (torch.float32, torch.bfloat16):
        mask = M.attention_mask_4d(query, valid, dtype)
        assert mask.shape == (3, 1, 12, 12) and mask.dtype == dtype
        assert torch.equal(mask[:, 0] == 0, allowed)
        assert torch.all(mask[:, 0][~allowed] == torch.finfo(dtype).min)
        scores = torch.randn(3, 2, 12, 12, dtype=dtype) + mask
        probs = torch.softmax(scores.float(), dim=-1)
        assert torch.isfinite(probs).all()  # no empty row, not even a padded one
        q = k = v = torch.randn(3, 2, 12, 4, dtype=dtype)
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        assert torch.isfinite(out.float()).all()


def test_flex_mask_mod_matches_dense():
    from torch.nn.attention.flex_attention import create_mask

    query, valid = small_batch()
    dense = create_mask(M.mask_mod_for(query, valid), 3, 1, 12, 12, device="cpu")
    assert torch.equal(dense[:, 0], M.allowed_matrix(query, valid))
    block = M.flex_block_mask(query, valid, block_size=128)
    assert block.shape == (3, 1, 12, 12)


# --------------------------------------------------------------------------- embeddings
def test_resize_embeddings_mean_and_three_times_mean(byte):
    from transformers import MistralConfig, MistralForCausalLM

    tok, _ = byte
    base = len(tok) - 284
    torch.manual_seed(0)
    model = MistralForCausalLM(MistralConfig(vocab_size=base, hidden_size=16, intermediate_size=32,
                                             num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                             tie_word_embeddings=False))
    old_in = model.get_input_embeddings().weight.detach().clone()
    old_out = model.get_output_embeddings().weight.detach().clone()
    assert T.resize_embeddings(model, tok) == 284
    new_in, new_out = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    assert new_in.shape == (len(tok), 16) and new_out.shape == (len(tok), 16)
    assert torch.equal(new_in[:base], old_in) and torch.equal(new_out[:base], old_out)
    torch.testing.assert_close(new_in[base:], old_in.mean(0).expand(284, -1))
    torch.testing.assert_close(new_out[base:], 3 * old_out.mean(0).expand(284, -1))
    assert model.config.vocab_size == len(tok)
    assert T.resize_embeddings(model, tok) == 0


# --------------------------------------------------------------------------- batches
def session(count, n, d, seed=0, key="film-000001"):
    reps = np.random.default_rng(seed).standard_normal((count, n, d)).astype(np.float16)
    return C.Session(make_turns(count), reps, key)


def test_collate_and_scatter_history(byte):
    tok, ids = byte
    n, d = 6, 5
    sessions = [session(3, n, d, 0), session(1, n, d, 1), session(2, n, d, 2)]
    examples = [C.make_example(ids, tok, s) for s in sessions]
    batch = C.collate_sequences(examples, ids.pad, pad_to_multiple_of=8)
    lengths = [len(e.sequence) for e in examples]
    width = batch["input_ids"].shape[1]
    assert width % 8 == 0 and width >= max(lengths)
    assert batch["history_reps"].shape == (3, 2, n, d) and batch["history_reps"].dtype == torch.float32
    assert batch["target_rep"].shape == (3, n, d)
    assert batch["history_counts"].tolist() == [2, 0, 1] and batch["lengths"].tolist() == lengths
    assert torch.all(batch["history_reps"][1] == 0) and torch.all(batch["history_reps"][2, 1] == 0)
    assert batch["query_mask"].sum(1).tolist() == [n, n, n]
    for row, (ex, length) in enumerate(zip(examples, lengths)):
        seq = ex.sequence
        assert batch["input_ids"][row, :length].tolist() == seq.input_ids
        assert torch.all(batch["input_ids"][row, length:] == ids.pad)
        assert batch["padding_mask"][row].tolist() == [True] * length + [False] * (width - length)
        assert torch.all(batch["labels"][row, length:] == S.IGNORE_INDEX)
        assert batch["labels"][row, :length].tolist() == seq.labels
        assert batch["position_ids"][row, :length].tolist() == list(range(length))
    # scatter: turn k's rep rows land exactly on turn k's frame positions, in frame order
    hidden = 4
    proj = torch.nn.Linear(d, hidden)
    embeds = torch.randn(3, width, hidden)
    projected = proj(batch["history_reps"])
    out = C.scatter_history(embeds, projected, batch["history_index"])
    for row, ex in enumerate(examples):
        seq = ex.sequence
        touched = torch.zeros(width, dtype=torch.bool)
        for k, start in enumerate(seq.frame_starts[:-1]):
            expected = proj(torch.from_numpy(ex.history_reps[k].astype(np.float32)))
            torch.testing.assert_close(out[row, start : start + n], expected)
            touched[start : start + n] = True
        assert torch.equal(touched, batch["history_mask"][row])
        assert torch.equal(out[row, ~touched], embeds[row, ~touched])
        queries = C.gather_queries(out, batch["query_mask"], n)[row]
        start = seq.frame_starts[-1]
        assert torch.equal(queries, out[row, start : start + n])
        torch.testing.assert_close(batch["target_rep"][row], torch.from_numpy(ex.target_rep.astype(np.float32)))
    # gradients reach the projected reps
    out.sum().backward()
    assert proj.weight.grad is not None and proj.weight.grad.abs().sum() > 0


def test_collate_without_history_and_prompts(byte):
    tok, ids = byte
    n, d = 4, 3
    batch = C.collate_sequences([C.make_example(ids, tok, session(1, n, d, s)) for s in range(2)], ids.pad)
    assert batch["history_reps"].shape == (2, 0, n, d)
    embeds = torch.randn(2, batch["input_ids"].shape[1], 8)
    assert torch.equal(C.scatter_history(embeds, torch.zeros(2, 0, n, 8), batch["history_index"]), embeds)
    turns = make_turns(2)
    prompts = [S.build_prompt(ids, tok, turns[:1], turns[1].instruction, n), S.build_prompt(ids, tok, [], "go", n)]
    left = C.collate_sequences(prompts, ids.pad, padding_side="left")
    assert "labels" not in left and "history_reps" not in left
    assert left["input_ids"][:, -1].tolist() == [ids.ml_start, ids.ml_start]
    assert left["position_ids"][1, -len(prompts[1]) :].tolist() == list(range(len(prompts[1])))


def _collate(examples, pad_id: int, packed: bool) -> dict:
    """Padded, or packed into rows of at most the longest + the shortest sequence (rows of one and of two)."""
    if not packed:
        return C.collate_sequences(examples, pad_id, pad_to_multiple_of=8)
    lengths = sorted(len(e.sequence) for e in examples)
    return P.pack_sequences(examples, pad_id, capacity=lengths[-1] + lengths[0], pad_to_multiple_of=8)


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_host_indices_give_the_masks_rows_in_their_order(byte, packed):
    """``query_index`` / ``label_index`` gather exactly what the boolean masks select, in the same order."""
    tok, ids = byte
    n, d = 6, 5
    examples = [C.make_example(ids, tok, session(count, n, d, seed)) for seed, count in enumerate((3, 1, 2))]
    batch = _collate(examples, ids.pad, packed)
    assert ("document_ids" in batch) == packed and batch["input_ids"].shape[0] == (2 if packed else 3)
    hidden = torch.randn(*batch["input_ids"].shape, 4)
    assert batch["query_index"].shape == (3, n)
    assert torch.equal(C.gather_flat(hidden, batch["query_index"]), C.gather_queries(hidden, batch["query_mask"], n))
    shifted = batch["labels"][:, 1:]
    selected = shifted != S.IGNORE_INDEX
    assert batch["label_index"].shape == (3 * 12,)  # the 12 state tokens of each target
    assert torch.equal(C.gather_flat(hidden, batch["label_index"]), hidden[:, :-1][selected])
    assert torch.equal(C.gather_flat(batch["labels"], batch["label_index"] + 1), shifted[selected])
    # inference prompts (left padding, no labels) get the query index alone
    turns = make_turns(2)
    prompts = [S.build_prompt(ids, tok, turns[:1], turns[1].instruction, n), S.build_prompt(ids, tok, [], "go", n)]
    left = C.collate_sequences(prompts, ids.pad, padding_side="left")
    assert "label_index" not in left
    assert torch.equal(C.gather_flat(hidden[:2, : left["input_ids"].shape[1]], left["query_index"]),
                       C.gather_queries(hidden[:2, : left["input_ids"].shape[1]], left["query_mask"], n))


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_collators_refuse_a_wrong_query_count(byte, packed):
    """A sequence with one query position too few: the collator says so, per row or per packed sequence,
    with the error of the model's own check (``check_query_counts``, shared)."""
    tok, ids = byte
    n, d = 4, 3
    good = [C.make_example(ids, tok, session(count, n, d, seed)) for seed, count in enumerate((2, 1, 1))]
    seq = good[1].sequence
    last = seq.query_positions[-1]
    short = dataclasses.replace(seq, query_mask=[q and p != last for p, q in enumerate(seq.query_mask)])
    bad = [good[0], dataclasses.replace(good[1], sequence=short), good[2]]
    unit = "packed sequence" if packed else "sample"
    with pytest.raises(ValueError, match=f"every {unit} needs exactly {n} query positions, got .*{n - 1}"):
        _collate(bad, ids.pad, packed)


def test_collator_refuses_history_indices_past_the_reps(byte):
    """A sequence whose frames name more history turns than it has reps: the collator's check, not an
    index error in the model."""
    tok, ids = byte
    n, d = 4, 3
    example = C.make_example(ids, tok, session(3, n, d))
    fewer = dataclasses.replace(example.sequence, turn_starts=example.sequence.turn_starts[1:])  # 1 history turn
    with pytest.raises(ValueError, match=f"history_index points past the {n} history rows"):
        C.collate_sequences([C.Example(fewer, example.history_reps[:1], example.target_rep)], ids.pad)


def test_window_sampler_weights_and_target():
    weights = [1.0, 0.0, 2.0, 1.0, 4.0]
    sampler = C.WindowSampler(weights, seed=123)
    again = C.WindowSampler(weights, seed=123)
    draws = [sampler.sample(5) for _ in range(4000)]
    assert draws[:50] == [again.sample(5) for _ in range(50)]
    counts = Counter(w.length for w in draws)
    assert counts[2] == 0
    for length in (1, 3, 4, 5):
        expected = weights[length - 1] / sum(weights)
        assert abs(counts[length] / len(draws) - expected) < 0.03, (length, counts)
    ends = Counter(w.target for w in draws if w.length == 1)
    assert set(ends) == set(range(5))  # a window may end anywhere valid
    assert all(0 <= w.start and w.stop <= 5 and w.target == w.stop - 1 for w in draws)
    # a shorter session: lengths past it are dropped and the rest renormalised
    short = [sampler.sample(3).length for _ in range(2000)]
    assert set(short) == {1, 3} and abs(short.count(3) / 2000 - 2 / 3) < 0.04
    with pytest.raises(ValueError):
        C.WindowSampler([0.0, 1.0]).sample(1)


def test_window_example_target_is_last_turn(byte):
    tok, ids = byte
    n, d = 3, 2
    full = session(5, n, d, 7)
    sampler = C.WindowSampler([1, 1, 1, 1, 1], seed=0)
    for _ in range(20):
        window = sampler.sample(len(full))
        ex = C.make_example(ids, tok, full.window(window))
        assert ex.sequence.num_history == window.length - 1
        np.testing.assert_array_equal(ex.target_rep, full.reps[window.target])
        np.testing.assert_array_equal(ex.history_reps, full.reps[window.start : window.target])
        assert S.parse_states(ids, ex.sequence.input_ids[ex.sequence.label_start :]) == \
            full.turns[window.target].states
    record = {"film": "f", "keys": ["a", "b"], "turns": [t.to_dict() for t in make_turns(2)]}
    assert len(C.Session.from_record(record, np.zeros((2, n, d)))) == 2
    with pytest.raises(ValueError):
        C.Session(make_turns(2), np.zeros((3, n, d)))


# --------------------------------------------------------------------------- CLI
def test_inspect_cli(tmp_path, capsys):
    from animegamer.cli.inspect import main

    game = tmp_path / "game.json"
    game.write_text(json.dumps({"turns": [t.to_dict() for t in make_turns(2)]}))
    assert main([str(game), "--query-tokens", "3", "--tokenizer", ""]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["num_history"] == 1 and len(out["tokens"]) == len(out["input_ids"]) == out["num_tokens"]
    assert out["label_tokens"][0] == "<Strength_2>" and out["label_tokens"][-1] == "</TURN>"
    assert "[history 0: <frame_00000>..<frame_00002> x3]" in out["compact"]
    assert main([str(game), "--query-tokens", "3", "--tokenizer", "", "--prompt"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["tokens"][-1] == "<ML>" and "labels" not in out
    assert math.isclose(sum(out["query_mask"]), 3)
    assert os.environ.get("HF_HUB_OFFLINE") == "1"


# --------------------------------------------------------------------------- end to end against the golden losses
@needs_official
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_golden_losses_with_plain_mistral(official, golden, attn):
    """This package's batch + scatter_history + 4-D mask on a plain HF Mistral (golden weights, LoRA
    merged) reproduce the official lm/rec losses, with padding and a second sample in the batch."""
    from transformers import MistralConfig, MistralForCausalLM

    tok, ids = official
    folder = GOLDEN.parent
    state = torch.load(folder / "pytorch_model.bin", weights_only=True)
    config = MistralConfig(**{**golden["llm_config"], "vocab_size": len(tok)})
    config._attn_implementation = attn
    model = MistralForCausalLM(config).eval()
    scale = golden["lora"]["alpha"] / golden["lora"]["r"]
    prefix, weights = "llm.base_model.model.", {}
    for key, value in state.items():
        if not key.startswith(prefix) or ".lora_" in key or "original_module" in key:
            continue
        name = key[len(prefix):]
        if ".base_layer." in name:
            value = value + scale * state[key.replace("base_layer", "lora_B.default")] @ \
                state[key.replace("base_layer", "lora_A.default")]
            name = name.replace(".base_layer", "")
        weights[name.replace(".modules_to_save.default", "")] = value
    model.load_state_dict(weights, strict=True)

    def mlp(name):  # Linear-GELU-Linear
        linear, gelu = torch.nn.functional.linear, torch.nn.functional.gelu
        w0, b0, w2, b2 = (state[f"{name}.proj.{i}.{p}"] for i in (0, 2) for p in ("weight", "bias"))
        return lambda x: linear(gelu(linear(x, w0, b0)), w2, b2)

    input_proj, output_proj = mlp("input_resampler"), mlp("output_resampler")
    reps = np.load(folder / "video_embeds.npy")[0]
    n = golden["num_query_tokens"]
    examples = [C.make_example(ids, tok, C.Session(golden["turns"][1:2], reps[1:2])),
                C.make_example(ids, tok, C.Session(golden["turns"], reps))]
    batch = C.collate_sequences(examples, ids.pad, pad_to_multiple_of=64)
    with torch.no_grad():
        embeds = model.get_input_embeddings()(batch["input_ids"])
        embeds = C.scatter_history(embeds, input_proj(batch["history_reps"]), batch["history_index"])
        mask = M.attention_mask_4d(batch["query_mask"], batch["padding_mask"], embeds.dtype)
        out = model(inputs_embeds=embeds, attention_mask=mask, position_ids=batch["position_ids"],
                    output_hidden_states=True)
        logits, labels = out.logits[1, :-1], batch["labels"][1, 1:]
        lm = torch.nn.functional.cross_entropy(logits, labels)
        pred = output_proj(C.gather_queries(out.hidden_states[-1], batch["query_mask"], n))
        rec = torch.nn.functional.mse_loss(pred[1], batch["target_rep"][1])
    expected = golden["expected"]
    assert lm.item() == pytest.approx(expected["lm_loss"], abs=1e-5)
    assert rec.item() == pytest.approx(expected["rec_loss"], abs=1e-5)
    np.testing.assert_allclose(pred[1].numpy(), np.load(folder / "expected_pred.npy")[0], atol=1e-5)
    label_logits = logits[labels != S.IGNORE_INDEX].numpy()
    np.testing.assert_allclose(label_logits, np.load(folder / "expected_label_logits.npy"), atol=1e-4)


def test_query_on_padding_of_a_packed_batch_is_a_clear_error():
    """A query position outside every packed sequence (document_ids -1) is named, not a bincount error."""
    import torch

    query_mask = torch.tensor([[False, True, True]])
    document_ids = torch.tensor([[0, 0, -1]])
    with pytest.raises(ValueError, match="query position lies on padding"):
        C.check_query_counts(query_mask, 1, document_ids)
