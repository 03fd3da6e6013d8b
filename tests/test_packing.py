"""Packed phase (b) batches: rows of several sequences give the padded batch's losses and predictions,
and no token attends across sequences."""
from __future__ import annotations

import pytest
import torch
from phase_a_helpers import logged_losses
from phase_b_helpers import tiny_b_cfg, write_synthetic_sessions

from animegamer.data.phase_b import SessionWindows, session_shards
from animegamer.mllm.collate import collate_sequences
from animegamer.mllm.masks import allowed_matrix, mask_mod_for
from animegamer.mllm.packing import assign_rows, pack_sequences
from animegamer.phases.phase_b import PhaseB
from animegamer.phases.run import train


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    return write_synthetic_sessions(tmp_path_factory.mktemp("sessions"), sessions=12)


def test_first_fit_decreasing_rows():
    assert assign_rows([5, 9, 3, 4, 12], capacity=12) == [[4], [1, 2], [0, 3]]
    assert assign_rows([20, 1], capacity=12) == [[0], [1]]  # too long for any row: a row of its own


def test_documents_never_attend_to_each_other():
    query = torch.tensor([[0, 1, 1, 0, 0, 1, 1, 0]], dtype=torch.bool)
    valid = torch.tensor([[1, 1, 1, 1, 1, 1, 1, 0]], dtype=torch.bool)
    docs = torch.tensor([[0, 0, 0, 0, 1, 1, 1, -1]])
    allowed = allowed_matrix(query, valid, docs)[0]
    assert not allowed[4:7, :4].any() and not allowed[:4, 4:7].any()
    assert allowed[1, 2] and allowed[5, 6] and not allowed[2, 5]  # queries: bidirectional within a document
    assert torch.equal(allowed[:4, :4], allowed_matrix(query[:, :4], valid[:, :4])[0])
    # FlexAttention's mask_mod states the same rule (flex itself needs a GPU; its kernels fail to build on CPU)
    mask_mod = mask_mod_for(query, valid, docs)
    grid = torch.arange(8)
    flex = mask_mod(torch.tensor(0), torch.tensor(0), grid[:, None], grid[None, :])
    assert torch.equal(flex, allowed)


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_packed_batch_equals_padded_batch(data_root, tmp_path, attention):
    _, cfg = tiny_b_cfg(data_root, tmp_path, f"model.mllm.attention={attention}")
    torch.manual_seed(0)
    module = PhaseB(cfg).eval()
    windows = SessionWindows(session_shards(cfg, "train"), module.tokenizer, module.ids, [1.0] * 5, seed=3)
    items = [windows[(i, i)] for i in range(6)]
    lengths = sorted(len(e.sequence) for e in items)
    assert lengths[0] < lengths[-1]  # windows of several lengths: something to pack
    padded = collate_sequences(items, module.ids.pad)
    packed = pack_sequences(items, module.ids.pad, capacity=lengths[-1] + lengths[0])
    assert packed["input_ids"].shape[0] < padded["input_ids"].shape[0]
    assert packed["padding_mask"].sum() == padded["padding_mask"].sum()

    with torch.no_grad():
        run = lambda batch: module.run_model(batch)  # the training path, the flex BlockMask included
        want, got = run(padded), run(packed)
    for name in ("lm_loss", "rec_loss", "loss"):
        torch.testing.assert_close(got[name], want[name], rtol=1e-5, atol=1e-6)
    order = [padded["keys"].index(k) for k in packed["keys"]]
    torch.testing.assert_close(got["pred"], want["pred"][order], rtol=1e-5, atol=1e-5)

    # Lengths rounded up to a multiple (phase.pad_to_multiple: few shapes for cuDNN's graphs) change nothing.
    rounded = {"padded": collate_sequences(items, module.ids.pad, pad_to_multiple_of=64),
               "packed": pack_sequences(items, module.ids.pad, capacity=lengths[-1] + lengths[0], pad_to_multiple_of=64)}
    for kind, batch in rounded.items():
        width, unrounded = batch["input_ids"].shape[1], (padded if kind == "padded" else packed)["input_ids"].shape[1]
        assert width % 64 == 0 and unrounded <= width < unrounded + 64
        assert batch["padding_mask"].sum() == padded["padding_mask"].sum()
        with torch.no_grad():
            out = run(batch)
        for name in ("lm_loss", "rec_loss", "loss"):
            torch.testing.assert_close(out[name], want[name], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(out["pred"], want["pred"][order] if kind == "packed" else want["pred"],
                                   rtol=1e-5, atol=1e-5)


def test_training_batches_are_rounded_to_the_configured_multiple(data_root, tmp_path):
    from animegamer.data.phase_b import train_loader

    for multiple in (0, 64):
        _, cfg = tiny_b_cfg(data_root, tmp_path, "phase.batch_size=3", f"phase.pad_to_multiple={multiple}")
        module = PhaseB(cfg)
        windows = SessionWindows(session_shards(cfg, "train"), module.tokenizer, module.ids, [1.0] * 5, seed=3)
        batches = [batch for batch, _ in zip(train_loader(cfg, windows, module.ids.pad, 0, 0, 1), range(4))]
        widths = [batch["input_ids"].shape[1] - int(batch["lengths"].max()) for batch in batches]
        if multiple:
            assert all(batch["input_ids"].shape[1] % multiple == 0 for batch in batches)
            assert all(0 <= w < multiple for w in widths) and any(w > 0 for w in widths), widths
        else:
            assert widths == [0, 0, 0, 0]


def test_training_with_packing_follows_the_padded_curve(data_root, tmp_path):
    for name, extra in (("padded", []), ("packed", ["phase.pack_tokens=600"])):
        composed, cfg = tiny_b_cfg(data_root, tmp_path / name, "phase.max_steps=4", "phase.batch_size=4",
                                   "model.mllm.lora_dropout=0", *extra)
        train(cfg, composed)
    padded, packed = logged_losses(tmp_path / "padded"), logged_losses(tmp_path / "packed")
    assert sorted(packed) == sorted(padded) == list(range(4))
    for step in padded:
        assert packed[step] == pytest.approx(padded[step], rel=1e-4), step
