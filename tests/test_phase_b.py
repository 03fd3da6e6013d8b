"""Phase (b) on tiny models: overfitting one session, exact resume, inference = training forward."""
from __future__ import annotations

import pytest
import torch
from phase_a_helpers import logged_losses
from phase_b_helpers import tiny_b_cfg, write_synthetic_sessions

from animegamer.phases.preflight import validate_train_run
from animegamer.data.phase_b import FullSessions, session_of, session_shards
from animegamer.mllm.collate import collate_sequences
from animegamer.mllm.predict import HistoryTurn, generate, predict_next, prompt_batch
from animegamer.phases.common import make_optimizer
from animegamer.phases.phase_b import PhaseB, label_count, state_accuracy
from animegamer.phases.specs import frozen_bf16_applies
from animegamer.phases.run import train


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    return write_synthetic_sessions(tmp_path_factory.mktemp("sessions"))


def _run(data_root, output, *overrides):
    composed, cfg = tiny_b_cfg(data_root, output, *overrides)
    validate_train_run(composed)
    return train(cfg, composed)


def test_resume_mid_run_continues_exactly(data_root, tmp_path):
    _run(data_root, tmp_path / "full")
    full = logged_losses(tmp_path / "full")
    _run(data_root, tmp_path / "split", "phase.max_steps=3")
    (tmp_path / "split" / "logs" / "metrics.csv").rename(tmp_path / "first.csv")
    _run(data_root, tmp_path / "split")
    resumed = logged_losses(tmp_path / "split")
    assert sorted(resumed) == [3, 4, 5]
    assert all(resumed[s] == full[s] for s in resumed), (resumed, full)


def test_throughput_bookkeeping_reads_only_host_values(data_root, tmp_path):
    """A batch moved to the device keeps ``lengths`` on the host, and the label count is ``label_index``'s
    size: the batch size, tokens and FLOPs of the throughput log wait for no device, and are the numbers
    the device tensors give. (The meta device holds no values: a read of a moved tensor would raise.)"""
    from animegamer.mllm.sequence import IGNORE_INDEX

    _, cfg = tiny_b_cfg(data_root, tmp_path)
    module = PhaseB(cfg)
    dataset = FullSessions(session_shards(cfg, "train"), module.tokenizer, module.ids)
    batch = collate_sequences([dataset[0], dataset[1]], pad_id=module.ids.pad)
    moved = module.transfer_batch_to_device(batch, torch.device("meta"), 0)
    assert moved.keys() == batch.keys() and moved["lengths"].device.type == "cpu"
    assert all(value.is_meta for key, value in moved.items() if torch.is_tensor(value) and key != "lengths")
    assert module.batch_size_of(moved) == 2
    assert module.tokens_of(moved) == int(batch["padding_mask"].sum())
    assert label_count(moved) == label_count({"labels": batch["labels"]}) == int((batch["labels"] != IGNORE_INDEX).sum())
    assert module.flops_per_batch(moved) == module.flops_per_batch(batch) > 0


def test_tiny_model_overfits_one_session(data_root, tmp_path):
    """Both losses fall by at least 10x and every state token is right."""
    _, cfg = tiny_b_cfg(data_root, tmp_path, "phase.lr=1e-2", "phase.warmup_steps=1", "phase.weight_decay=0",
                        "model.mllm.lora_dropout=0")
    module = PhaseB(cfg)
    dataset = FullSessions(session_shards(cfg, "train"), module.tokenizer, module.ids)
    batch = collate_sequences([dataset[0]], pad_id=module.ids.pad)
    optimizer = make_optimizer(module.model, cfg.phase)["optimizer"]
    first = module.run_model(batch)
    for _ in range(120):
        optimizer.zero_grad()
        module.run_model(batch)["loss"].backward()
        optimizer.step()
    last = module.run_model(batch)
    assert float(last["lm_loss"]) < float(first["lm_loss"]) / 10, (first["lm_loss"], last["lm_loss"])
    assert float(last["rec_loss"]) < float(first["rec_loss"]) / 10, (first["rec_loss"], last["rec_loss"])
    assert float(state_accuracy(last["label_logits"], batch["labels"], module.ids)) == 1.0
    # The trained model also *generates* the right states from the inference prompt.
    sample = session_of(dataset.sessions[0])
    history = [HistoryTurn(t, torch.as_tensor(r).float()) for t, r in zip(sample.turns[:-1], sample.reps[:-1])]
    prediction = predict_next(module.model, module.tokenizer, module.ids, history, sample.turns[-1].instruction, 5)
    assert prediction.states == dict(sample.turns[-1].states)


def test_inference_rep_equals_training_forward_at_query_positions(data_root, tmp_path):
    _, cfg = tiny_b_cfg(data_root, tmp_path, "model.mllm.lora_dropout=0")
    module = PhaseB(cfg).eval()
    dataset = FullSessions(session_shards(cfg, "val"), module.tokenizer, module.ids)
    example = dataset[0]
    with torch.no_grad():
        training_pred = module.run_model(collate_sequences([example], pad_id=module.ids.pad))["pred"][0]
    sample = session_of(dataset.sessions[0])
    history = [HistoryTurn(t, torch.as_tensor(r).float()) for t, r in zip(sample.turns[:-1], sample.reps[:-1])]
    batch = prompt_batch(module.model, module.tokenizer, module.ids, history, sample.turns[-1].instruction, 5)
    _, rep = generate(module.model, module.ids, batch)  # untrained: the states are garbage, the rep is read
    torch.testing.assert_close(rep, training_pred.float(), rtol=1e-5, atol=1e-6)


def test_constrained_state_decoding_is_always_well_formed(data_root, tmp_path):
    """An untrained model's free generation breaks the layout (an error with its text); constrained
    decoding picks its most likely valid states, with the same representation."""
    from animegamer.mllm.predict import state_grammar

    _, cfg = tiny_b_cfg(data_root, tmp_path, "model.mllm.lora_dropout=0")
    module = PhaseB(cfg).eval()
    sample = session_of(FullSessions(session_shards(cfg, "val"), module.tokenizer, module.ids).sessions[0])
    history = [HistoryTurn(t, torch.as_tensor(r).float()) for t, r in zip(sample.turns[:-1], sample.reps[:-1])]
    args = (module.model, module.tokenizer, module.ids, history, sample.turns[-1].instruction, 5)
    with pytest.raises(ValueError, match="malformed state generation"):
        predict_next(*args)
    prediction = predict_next(*args, constrained=True)
    grammar = state_grammar(module.ids)
    assert len(prediction.tokens) == len(grammar) and all(t in allowed for t, allowed in zip(prediction.tokens, grammar))
    assert 1 <= prediction.states["ML"] <= 5
    _, free_rep = generate(module.model, module.ids, prompt_batch(*args))
    torch.testing.assert_close(prediction.rep, free_rep)


def test_validation_reports_state_accuracy_on_held_out_sessions(data_root, tmp_path):
    composed, cfg = tiny_b_cfg(data_root, tmp_path, "phase.max_steps=2", "phase.val_every_n_steps=2")
    assert len(session_shards(cfg, "val")) > 0  # the synthetic split holds some sessions out
    metrics = train(cfg, composed)["metrics"]
    assert 0 <= metrics["val/state_accuracy"] <= 1
    assert metrics["val/loss"] == pytest.approx(metrics["val/lm_loss"] + metrics["val/rec_loss"], rel=1e-5)


def test_empty_held_out_split_skips_validation_and_says_so(data_root, tmp_path, caplog):
    composed, cfg = tiny_b_cfg(data_root, tmp_path, "phase.max_steps=2", "phase.val_every_n_steps=1",
                               "data.val_fraction=0")
    with caplog.at_level("WARNING", logger="animegamer.training.shard_data"):
        metrics = train(cfg, composed)["metrics"]
    assert not any(name.startswith("val/") for name in metrics)
    assert "validation skipped: the held-out split is empty" in caplog.text


def test_an_empty_training_split_fails_before_the_mllm_is_built(data_root, tmp_path, monkeypatch):
    """Every synthetic session held out: the run stops with what to change, and PhaseB is never built."""
    from animegamer.errors import InvalidInputError
    from animegamer.phases import run as runner

    built = []
    monkeypatch.setattr("animegamer.phases.phase_b.PhaseB", lambda cfg: built.append(cfg))
    composed, cfg = tiny_b_cfg(data_root, tmp_path / "run", "data.val_fraction=1.0")
    with pytest.raises(InvalidInputError) as caught:
        runner.train(cfg, composed)
    sessions = len(session_shards(tiny_b_cfg(data_root, tmp_path / "x", "data.val_fraction=0.0")[1], "train"))
    assert f"none of its {sessions} samples is on this side of the held-out split" in str(caught.value)
    assert "data.val_fraction" in str(caught.value) and built == []


def test_frozen_bf16_holds_the_base_in_bf16_trains_like_float32_and_resumes_exactly(data_root, tmp_path):
    """``phase.frozen_bf16`` under bf16-mixed: frozen weights bf16, trained ones float32, the same losses as
    the float32 base (autocast rounds each weight to bf16 exactly as the cast does), and a stop and resume
    that continues exactly."""
    mixed = ("trainer.precision=bf16-mixed",)
    base = _run(data_root, tmp_path / "float32_base", *mixed, "phase.frozen_bf16=false")
    assert {p.dtype for p in base["module"].model.parameters() if p.is_floating_point()} == {torch.float32}
    out = _run(data_root, tmp_path / "full", *mixed)  # the default (null) turns it on under bf16-mixed
    params = list(out["module"].model.parameters())
    assert {p.dtype for p in params if not p.requires_grad and p.is_floating_point()} == {torch.bfloat16}
    assert {p.dtype for p in params if p.requires_grad} == {torch.float32}
    reference, full = logged_losses(tmp_path / "float32_base"), logged_losses(tmp_path / "full")
    assert len(full) >= 5 and full == reference
    _run(data_root, tmp_path / "split", *mixed, "phase.frozen_bf16=true", "phase.max_steps=3")
    (tmp_path / "split" / "logs" / "metrics.csv").rename(tmp_path / "first.csv")
    _run(data_root, tmp_path / "split", *mixed)
    resumed = logged_losses(tmp_path / "split")
    assert sorted(resumed) == [3, 4, 5] and all(resumed[s] == full[s] for s in resumed), (resumed, full)


@pytest.mark.parametrize("overrides, message", [
    (("trainer.precision=32-true",), "needs trainer.precision=bf16-mixed"),
    (("trainer=deepspeed_zero2",), "already holds every weight in bf16"),
    (("trainer=fsdp",), "FSDP shards units of one dtype"),
])
def test_frozen_bf16_is_refused_where_it_does_not_apply(data_root, tmp_path, overrides, message):
    from animegamer.config.validate import ConfigError

    composed, _ = tiny_b_cfg(data_root, tmp_path, "phase.frozen_bf16=true", *overrides)
    with pytest.raises(ConfigError, match=message):
        validate_train_run(composed)
    composed, cfg = tiny_b_cfg(data_root, tmp_path, *overrides)  # the default (null) stays off there, unrefused
    validate_train_run(composed)
    assert not frozen_bf16_applies(cfg)
