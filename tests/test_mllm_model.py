"""The game-state MLLM (phase b) at the tiny preset: CPU, seconds.

Batches come from the real data side (:mod:`animegamer.mllm`: byte tokenizer + the 284 AnimeGamer
tokens, ``build_sequence`` / ``build_prompt``, ``collate_sequences``). Paper sizes are checked on
the meta device (no weights allocated) for the size of the trainable LoRA set.
"""
from __future__ import annotations

import dataclasses
import logging

import pytest
import torch

from animegamer.config.schema import MLLMConfig, ModelConfig
from animegamer.mllm.collate import LABEL_INDEX, QUERY_INDEX, Example, collate_sequences
from animegamer.mllm.masks import attention_mask_4d
from animegamer.mllm.packing import pack_sequences
from animegamer.mllm.sequence import IGNORE_INDEX, Turn, build_prompt, build_sequence
from animegamer.models.game_mllm import MODEL_KEYS, run_batch
from animegamer.models.mllm import GameStateMLLM
from phase_b_helpers import model_cfg, vocab  # noqa: F401  (fixtures)

logger = logging.getLogger(__name__)

SEED = 0
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
STATES = [{"ML": 1, "SC": 1, "ET": 0, "ST": 1}, {"ML": 4, "SC": 0, "ET": 1, "ST": -1},
          {"ML": 2, "SC": -1, "ET": 0, "ST": 1}]
BATCH_KEYS = ("input_ids", "history_reps", "history_index", "query_mask", "labels", "target_rep", "position_ids",
              "padding_mask")
HOST_INDICES = (QUERY_INDEX, LABEL_INDEX)
# Training batches as the loader gives them: (window turn counts, packed); packed rows hold one or two windows.
LAYOUTS = {"padded": ((3, 1, 2), False), "packed": ((3, 1, 2), True), "padded-no-history": ((1, 1), False),
           "packed-no-history": ((1, 1, 1), True)}


def _sizes(model_cfg: ModelConfig) -> tuple[int, int]:
    """(D, N): the encoder width and token count."""
    return model_cfg.encoder.width, model_cfg.encoder.text_tokens + model_cfg.encoder.image_tokens


def _model(model_cfg: ModelConfig, vocab, seed: int = SEED, lora: bool = True, **changes) -> GameStateMLLM:
    width, tokens = _sizes(model_cfg)
    cfg = dataclasses.replace(model_cfg.mllm, **changes)
    return GameStateMLLM(cfg, width, tokens, len(vocab[0]), seed=seed, lora=lora).eval()


def _turns(count: int) -> list[Turn]:
    return [Turn(f"Character: Kiki; Motion: fly {i}; Background: sky.", STATES[i % len(STATES)])
            for i in range(count)]


def _examples(model_cfg: ModelConfig, vocab, turn_counts=(3, 1)) -> list[Example]:
    tokenizer, ids = vocab
    width, tokens = _sizes(model_cfg)
    generator = torch.Generator().manual_seed(SEED + 1)
    examples = []
    for count in turn_counts:
        reps = torch.randn(count, tokens, width, generator=generator)
        sequence = build_sequence(ids, tokenizer, _turns(count), num_query_tokens=tokens)
        examples.append(Example(sequence, reps[:-1], reps[-1]))
    return examples


def _batch(model_cfg: ModelConfig, vocab, turn_counts=(3, 1)) -> dict:
    batch = collate_sequences(_examples(model_cfg, vocab, turn_counts), vocab[1].pad)
    return {k: batch[k] for k in BATCH_KEYS}


def _loader_batch(model_cfg: ModelConfig, vocab, layout: str) -> dict:
    """What the training loader gives the network (the collator's host indices included): padded, or
    packed into rows of at most the longest + the shortest window."""
    turn_counts, packed = LAYOUTS[layout]
    examples = _examples(model_cfg, vocab, turn_counts)
    if packed:
        lengths = sorted(len(e.sequence) for e in examples)
        batch = pack_sequences(examples, vocab[1].pad, capacity=lengths[-1] + lengths[0])
    else:
        batch = collate_sequences(examples, vocab[1].pad)
    return {k: batch[k] for k in MODEL_KEYS if k in batch}


def _without_indices(batch: dict) -> dict:
    """The batch as a caller building it by hand gives it: the model reads (and checks) the masks."""
    return {k: v for k, v in batch.items() if k not in HOST_INDICES}


def _randomize(model: GameStateMLLM, seed: int = SEED + 7) -> None:
    """Give every trainable tensor (LoRA B included, zero at init) random values."""
    generator = torch.Generator().manual_seed(seed)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name in model.trainable_parameter_names():
            params[name].add_(0.05 * torch.randn(params[name].shape, generator=generator))


# --------------------------------------------------------------------------- shapes and losses
def test_forward_shapes_and_losses(model_cfg, vocab):
    model = _model(model_cfg, vocab)
    batch = _batch(model_cfg, vocab)
    width, tokens = _sizes(model_cfg)
    out = model(**batch, return_logits=True)
    batch_size, length = batch["input_ids"].shape
    assert out["pred"].shape == (batch_size, tokens, width)
    labelled = int((batch["labels"][:, 1:] != -100).sum())
    assert labelled == 12 * batch_size
    assert out["label_logits"].shape == (labelled, len(vocab[0]))
    assert out["logits"].shape == (batch_size, length, len(vocab[0]))
    for key in ("loss", "lm_loss", "rec_loss"):
        assert out[key].ndim == 0 and torch.isfinite(out[key]), key
    assert out["cos_loss"] is None
    torch.testing.assert_close(out["loss"], out["lm_loss"] + out["rec_loss"])
    # label_logits are the full logits at the positions that predict a label
    shifted = batch["labels"][:, 1:] != -100
    torch.testing.assert_close(out["label_logits"], out["logits"][:, :-1][shifted])
    manual_rec = torch.nn.functional.mse_loss(out["pred"], batch["target_rep"])
    torch.testing.assert_close(out["rec_loss"], manual_rec)


def test_loss_terms_follow_their_weights(model_cfg, vocab):
    batch = _batch(model_cfg, vocab)
    plain = _model(model_cfg, vocab)(**batch)
    weighted = _model(model_cfg, vocab, lm_weight=0.5, rec_weight=2.0)(**batch)
    torch.testing.assert_close(weighted["loss"], 0.5 * plain["lm_loss"] + 2.0 * plain["rec_loss"])


def test_cosine_term_only_with_its_weight(model_cfg, vocab):
    batch = _batch(model_cfg, vocab)
    off = _model(model_cfg, vocab)(**batch)
    on = _model(model_cfg, vocab, cos_weight=0.5)(**batch)
    assert off["cos_loss"] is None
    cosine = torch.nn.functional.cosine_similarity(on["pred"], batch["target_rep"], dim=-1).mean()
    torch.testing.assert_close(on["cos_loss"], 1.0 - cosine)
    torch.testing.assert_close(on["loss"], on["lm_loss"] + on["rec_loss"] + 0.5 * on["cos_loss"])
    torch.testing.assert_close(on["loss"] - 0.5 * on["cos_loss"], off["loss"])


def test_history_positions_hold_projected_reps(model_cfg, vocab):
    model = _model(model_cfg, vocab)
    batch = _batch(model_cfg, vocab)
    embeds = model.embed_inputs(batch["input_ids"], batch["history_reps"], batch["history_index"])
    tokens = model.causal_lm.get_input_embeddings()(batch["input_ids"])
    index = batch["history_index"]
    width = batch["history_reps"].shape[-1]
    history = index >= 0
    assert int(history[0].sum()) == 2 * model.num_query_tokens and int(history[1].sum()) == 0
    rows = batch["history_reps"].reshape(index.shape[0], -1, width)
    for b, p in history.nonzero().tolist():
        torch.testing.assert_close(embeds[b, p], model.input_proj(rows[b, index[b, p]]))
    torch.testing.assert_close(embeds[~history], tokens[~history])
    # the queries keep the learned <frame_i> embeddings
    torch.testing.assert_close(embeds[batch["query_mask"]], tokens[batch["query_mask"]])


def test_no_history_batch_keeps_input_proj_in_the_graph(model_cfg, vocab):
    """A batch of one-turn windows still gives input_proj a (zero) gradient: DDP sees every parameter."""
    model = _model(model_cfg, vocab)
    batch = _batch(model_cfg, vocab, turn_counts=(1, 1))
    assert batch["history_reps"].shape[1] == 0
    model(**batch)["loss"].backward()
    for name, param in model.input_proj.named_parameters():
        assert param.grad is not None and torch.count_nonzero(param.grad) == 0, name


# --------------------------------------------------------------------------- host indices
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_host_indices_give_bitwise_the_mask_paths_losses_and_gradients(model_cfg, vocab, layout):
    """The collator's indices select the masks' rows in the masks' order: every output and every
    gradient is bitwise the same (LoRA dropout on, drawn alike)."""
    model = _model(model_cfg, vocab, lora_dropout=0.1)
    _randomize(model)
    batch = _loader_batch(model_cfg, vocab, layout)
    assert all(key in batch for key in HOST_INDICES) and ("document_ids" in batch) == LAYOUTS[layout][1]
    indexed, indexed_grads = _outputs_and_grads(model, batch)
    masked, masked_grads = _outputs_and_grads(model, _without_indices(batch))
    assert indexed.keys() == masked.keys() >= {"loss", "lm_loss", "rec_loss", "pred", "label_logits"}
    for key in indexed:
        assert torch.equal(indexed[key], masked[key]), key
    assert indexed_grads.keys() == masked_grads.keys() == set(model.trainable_parameter_names())
    for name in indexed_grads:
        assert torch.equal(indexed_grads[name], masked_grads[name]), name


def test_host_indices_without_labels_give_the_mask_paths_zero_lm_loss(model_cfg, vocab):
    """A batch whose labels are all ignored: an empty ``label_index``, the head kept in the graph with a
    zero loss, as on the mask path."""
    model = _model(model_cfg, vocab)
    batch = _loader_batch(model_cfg, vocab, "packed")
    batch["labels"] = torch.full_like(batch["labels"], IGNORE_INDEX)
    batch[LABEL_INDEX] = batch[LABEL_INDEX][:0]  # what the collator computes for these labels
    indexed, indexed_grads = _outputs_and_grads(model, batch)
    masked, masked_grads = _outputs_and_grads(model, _without_indices(batch))
    assert indexed["label_logits"].shape[0] == 0 and indexed["lm_loss"] == 0
    for key in indexed:
        assert torch.equal(indexed[key], masked[key]), key
    for name in indexed_grads:
        assert torch.equal(indexed_grads[name], masked_grads[name]), name


@pytest.mark.parametrize("layout", ["packed", "padded"])
def test_training_forward_with_host_indices_reads_nothing_back(model_cfg, vocab, layout):
    """Forward and backward of a loader batch never read a tensor's value on the host (on a GPU each
    such read waits for the device). Fake tensors have no values: any read (``.item()``, ``bool()``,
    ``.tolist()``, a boolean-mask index, ``nonzero``) raises. Without the indices the same batch
    does read, so the check can fail."""
    from torch._subclasses.fake_tensor import (DataDependentOutputException, DynamicOutputShapeException,
                                               FakeTensorMode)

    model = _model(model_cfg, vocab, lora_dropout=0.1).train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    batch = _loader_batch(model_cfg, vocab, layout)

    def step(batch: dict) -> None:
        with FakeTensorMode(allow_non_fake_inputs=True) as mode:
            loss = run_batch(model, {k: mode.from_tensor(v) for k, v in batch.items()})["loss"]
            torch.autograd.grad(loss, trainable)  # the backward too (a mask index's backward reads it again)

    step(batch)
    with pytest.raises((DataDependentOutputException, DynamicOutputShapeException)):
        step(_without_indices(batch))


@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_mask_path_checks_the_query_counts_as_the_collator_does(model_cfg, vocab, layout):
    """A hand-built batch (no indices) with a query position missing: the model's own check, the
    collator's error."""
    model = _model(model_cfg, vocab)
    batch = _loader_batch(model_cfg, vocab, layout)
    query_mask = batch["query_mask"].clone()
    query_mask.view(-1)[batch[QUERY_INDEX][1, -1]] = False  # the second sequence's last query
    unit = "packed sequence" if LAYOUTS[layout][1] else "sample"
    with pytest.raises(ValueError, match=f"every {unit} needs exactly {model.num_query_tokens} query positions"):
        run_batch(model, {**_without_indices(batch), "query_mask": query_mask})


# --------------------------------------------------------------------------- trainable set
def _expected_trainable(model_cfg: ModelConfig, norms: bool = True, embeddings: bool = True) -> set[str]:
    prefix = "llm.base_model.model."
    names = {f"{p}_proj.{i}.{w}" for p in ("input", "output") for i in (0, 2) for w in ("weight", "bias")}
    for layer in range(model_cfg.mllm.num_hidden_layers):
        for target in LORA_TARGETS:
            block = "self_attn" if target in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
            names |= {f"{prefix}model.layers.{layer}.{block}.{target}.lora_{ab}.default.weight" for ab in "AB"}
        if norms:
            names |= {f"{prefix}model.layers.{layer}.{norm}.weight"
                      for norm in ("input_layernorm", "post_attention_layernorm")}
    if norms:
        names.add(f"{prefix}model.norm.weight")
    if embeddings:
        names |= {f"{prefix}model.embed_tokens.weight", f"{prefix}lm_head.weight"}
    return names


@pytest.mark.parametrize("norms,embeddings", [(True, True), (False, False), (True, False)])
def test_trainable_parameters_are_exactly_the_phase_b_set(model_cfg, vocab, norms, embeddings):
    model = _model(model_cfg, vocab, train_norms=norms, train_embeddings=embeddings)
    expected = _expected_trainable(model_cfg, norms, embeddings)
    assert set(model.trainable_parameter_names()) == expected
    assert {n for n, p in model.named_parameters() if p.requires_grad} == expected
    _randomize(model)  # LoRA B = 0 would leave the LoRA A gradient zero, still present
    model(**_batch(model_cfg, vocab))["loss"].backward()
    with_grad = {n for n, p in model.named_parameters() if p.grad is not None}
    assert with_grad == expected


def test_paper_size_lora_on_meta_device():
    """Mistral-7B sizes (no weights allocated): LoRA r 32 on the 7 targets of 32 layers = 83,886,080."""
    cfg = MLLMConfig()
    with torch.device("meta"):
        model = GameStateMLLM(cfg, rep_width=1920, num_query_tokens=226, vocab_size=32284, seed=None)
    params = dict(model.named_parameters())
    lora = sum(params[n].numel() for n in model.lora_parameters())
    assert lora == 32 * 32 * (2 * (4096 + 4096) + 2 * (4096 + 1024) + 3 * (4096 + 14336)) == 83_886_080
    assert params["llm.base_model.model.lm_head.weight"].shape == (32284, 4096)
    assert params["input_proj.0.weight"].shape == (4096, 1920) and params["output_proj.2.weight"].shape == (1920, 1920)


# --------------------------------------------------------------------------- inference paths
def test_predict_rep_equals_training_pred(model_cfg, vocab):
    model = _model(model_cfg, vocab)
    _randomize(model)
    batch = _batch(model_cfg, vocab)
    pred = model(**batch)["pred"]
    inputs = {k: batch[k] for k in ("input_ids", "history_reps", "history_index", "query_mask", "position_ids",
                                    "padding_mask")}
    assert torch.equal(model.predict_rep(**inputs), pred)


def test_padding_and_batching_do_not_change_a_sample(model_cfg, vocab):
    """The short row of a right-padded batch gives what it gives alone (masks and positions are right)."""
    model = _model(model_cfg, vocab)
    _randomize(model)
    batch = _batch(model_cfg, vocab, turn_counts=(3, 1))
    alone = _batch(model_cfg, vocab, turn_counts=(1,))
    both = model(**batch, return_logits=True)
    single = model(**alone, return_logits=True)
    length = alone["input_ids"].shape[1]
    torch.testing.assert_close(both["pred"][1], single["pred"][0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(both["logits"][1, :length], single["logits"][0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_explicit_4d_masks_equal_the_default(model_cfg, vocab, attention):
    model = _model(model_cfg, vocab, attention=attention)
    _randomize(model)
    batch = _batch(model_cfg, vocab)
    default = model(**batch)
    additive = attention_mask_4d(batch["query_mask"], batch["padding_mask"])
    for mask in (additive, additive == 0):
        explicit = model(**{k: v for k, v in batch.items() if k != "padding_mask"}, attention_mask_4d=mask)
        torch.testing.assert_close(explicit["loss"], default["loss"])
        torch.testing.assert_close(explicit["pred"], default["pred"])


def test_sdpa_and_eager_agree(model_cfg, vocab):
    batch = _batch(model_cfg, vocab)
    outs = []
    for attention in ("sdpa", "eager"):
        model = _model(model_cfg, vocab, attention=attention)
        _randomize(model)
        outs.append(model(**batch))
    torch.testing.assert_close(outs[0]["pred"], outs[1]["pred"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(outs[0]["loss"], outs[1]["loss"], rtol=1e-5, atol=1e-5)


def _prompt(model_cfg, vocab, history: int, instruction: str = "Character: Kiki; Motion: land; Background: hill."):
    tokenizer, ids = vocab
    width, tokens = _sizes(model_cfg)
    sequence = build_prompt(ids, tokenizer, _turns(history), instruction, num_query_tokens=tokens)
    reps = torch.randn(history, tokens, width, generator=torch.Generator().manual_seed(SEED + 3))
    return Example(sequence, reps)


def test_greedy_generation_matches_teacher_forcing(model_cfg, vocab):
    """Each generated token is the argmax of a full forward over prompt + the tokens before it (KV cache
    loop == no cache), and the prefill's rep equals predict_rep on the prompt."""
    model = _model(model_cfg, vocab)
    _randomize(model)
    prompt = collate_sequences([_prompt(model_cfg, vocab, history=2)], vocab[1].pad)
    inputs = {k: prompt[k] for k in ("history_reps", "history_index", "query_mask")}
    out = model.generate_states(prompt["input_ids"], **inputs, max_new_tokens=6)
    generated = out["tokens"]
    assert generated.shape == (1, 6)
    torch.testing.assert_close(out["pred"], model.predict_rep(prompt["input_ids"], **inputs))

    full_ids = torch.cat([prompt["input_ids"], generated[:, :-1]], dim=1)
    pad = torch.full_like(generated[:, :-1], -1)
    full = model(full_ids, history_reps=prompt["history_reps"],
                 history_index=torch.cat([prompt["history_index"], pad], dim=1),
                 query_mask=torch.cat([prompt["query_mask"], pad >= 0], dim=1), return_logits=True)
    length = prompt["input_ids"].shape[1]
    assert torch.equal(full["logits"][0, length - 1:].argmax(-1), generated[0])


def test_batched_left_padded_generation_equals_single(model_cfg, vocab):
    model = _model(model_cfg, vocab)
    _randomize(model)
    items = [_prompt(model_cfg, vocab, history=2), _prompt(model_cfg, vocab, history=0, instruction="Character: Jiji.")]
    keys = ("history_reps", "history_index", "query_mask", "position_ids", "padding_mask")
    batch = collate_sequences(items, vocab[1].pad, padding_side="left")
    together = model.generate_states(batch["input_ids"], **{k: batch[k] for k in keys}, max_new_tokens=5)
    for row, item in enumerate(items):
        alone = collate_sequences([item], vocab[1].pad)
        single = model.generate_states(alone["input_ids"], **{k: alone[k] for k in keys}, max_new_tokens=5)
        assert torch.equal(together["tokens"][row], single["tokens"][0])
        torch.testing.assert_close(together["pred"][row], single["pred"][0], rtol=1e-5, atol=1e-6)


def test_generation_stops_at_the_stop_token(model_cfg, vocab):
    model = _model(model_cfg, vocab)
    prompt = collate_sequences([_prompt(model_cfg, vocab, history=1)], vocab[1].pad)
    inputs = {k: prompt[k] for k in ("history_reps", "history_index", "query_mask")}
    first = model.generate_states(prompt["input_ids"], **inputs, max_new_tokens=4)["tokens"]
    stopped = model.generate_states(prompt["input_ids"], **inputs, max_new_tokens=4,
                                    stop_token_id=int(first[0, 1]))["tokens"]
    assert torch.equal(stopped[0], first[0, :2])


def test_gradient_checkpointing_gives_the_same_gradients(model_cfg, vocab):
    model = _model(model_cfg, vocab).train()
    _randomize(model)
    batch = _batch(model_cfg, vocab)
    model(**batch)["loss"].backward()
    plain = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    model.set_gradient_checkpointing(True)
    layers = model.causal_lm.model.layers
    assert all(hasattr(layer, "_animegamer_forward") for layer in layers)  # every layer recomputes
    model(**batch)["loss"].backward()
    checkpointed = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert checkpointed.keys() == plain.keys()
    for name, grad in plain.items():
        torch.testing.assert_close(checkpointed[name], grad, rtol=1e-5, atol=1e-7, msg=name)
    model.set_gradient_checkpointing(False)
    assert not any(hasattr(layer, "_animegamer_forward") for layer in layers)


# --------------------------------------------------------------------------- construction and folders
def test_seeded_construction(model_cfg, vocab):
    state = torch.random.get_rng_state()
    a, b, c = (_model(model_cfg, vocab, seed=s) for s in (SEED, SEED, SEED + 1))
    assert torch.equal(torch.random.get_rng_state(), state)  # building does not move the caller's RNG
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)


def test_new_vocabulary_rows_follow_the_official_rule(model_cfg, vocab):
    """A random build at Mistral's base vocabulary grows by the 284 tokens: inputs = mean, outputs = 3 x mean."""
    cfg = dataclasses.replace(model_cfg.mllm, vocab_size=1000)
    model = GameStateMLLM(cfg, *_sizes(model_cfg), vocab_size=1284)
    inputs = model.causal_lm.get_input_embeddings().weight
    outputs = model.causal_lm.get_output_embeddings().weight
    torch.testing.assert_close(inputs[1000:], inputs[:1000].mean(0, keepdim=True).expand(284, -1))
    torch.testing.assert_close(outputs[1000:], 3 * outputs[:1000].mean(0, keepdim=True).expand(284, -1))


def test_merge_lora_keeps_the_outputs(model_cfg, vocab):
    model = _model(model_cfg, vocab)
    _randomize(model)
    batch = _batch(model_cfg, vocab)
    before = model(**batch)
    model.merge_lora()
    after = model(**batch)
    assert not model.has_lora
    torch.testing.assert_close(after["pred"], before["pred"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(after["loss"], before["loss"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("lora_on_load", [True, False], ids=["with-adapter", "adapter-added-on-load"])
def test_adapter_round_trip_is_exact(model_cfg, vocab, tmp_path, lora_on_load):
    model = _model(model_cfg, vocab)
    _randomize(model)
    folder = model.save_adapter(tmp_path / "adapter")
    assert {p.name for p in folder.iterdir()} == {"adapter_config.json", "adapter_model.safetensors",
                                                   "mllm_modules.safetensors", "mllm_meta.json"}
    fresh = _model(model_cfg, vocab, lora=lora_on_load)  # same seed: the same frozen base weights
    fresh.load_adapter(folder)
    ours, theirs = fresh.state_dict(), model.state_dict()
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
    batch = _batch(model_cfg, vocab)
    assert torch.equal(fresh(**batch)["loss"], model(**batch)["loss"])


def test_adapter_refuses_another_model(model_cfg, vocab, tmp_path):
    folder = _model(model_cfg, vocab).save_adapter(tmp_path / "adapter")
    width, tokens = _sizes(model_cfg)
    other = GameStateMLLM(model_cfg.mllm, width + 8, tokens, len(vocab[0]))
    with pytest.raises(ValueError, match="rep_width"):
        other.load_adapter(folder)


# --------------------------------------------------------------------------- model.mllm.compile
def _outputs_and_grads(model, batch):
    """One training forward (``run_batch``, as phase b) and backward: the outputs, detached, and the gradients."""
    model.train()
    model.zero_grad(set_to_none=True)
    torch.manual_seed(0)  # LoRA dropout
    out = run_batch(model, batch)
    out["loss"].backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return {k: v.detach() for k, v in out.items() if v is not None}, grads


@pytest.mark.parametrize("checkpointing", [False, True])
def test_compiled_layers_match_eager(model_cfg, vocab, checkpointing):
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    eager = _model(model_cfg, vocab, gradient_checkpointing=checkpointing, lora_dropout=0.0)
    compiled = _model(model_cfg, vocab, gradient_checkpointing=checkpointing, lora_dropout=0.0, compile=True)
    _randomize(eager)
    _randomize(compiled)
    assert list(dict(eager.named_parameters())) == list(dict(compiled.named_parameters()))
    for turn_counts in ((3, 1), (2, 2, 1)):  # two padded lengths: the dynamic graph is reused
        batch = _batch(model_cfg, vocab, turn_counts)
        out_e, grads_e = _outputs_and_grads(eager, batch)
        out_c, grads_c = _outputs_and_grads(compiled, batch)
        assert out_c["loss"].item() == pytest.approx(out_e["loss"].item(), rel=1e-4)
        torch.testing.assert_close(out_c["pred"], out_e["pred"], rtol=1e-4, atol=1e-5)
        assert grads_c.keys() == grads_e.keys() and grads_e
        for name in grads_e:
            torch.testing.assert_close(grads_c[name], grads_e[name], rtol=1e-3, atol=1e-5, msg=name)
    # one graph for both layers and both padded lengths, and no layer fell back to eager in part
    assert counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"]


def test_compile_switch_compiles_every_layer_in_place(model_cfg, vocab):
    compiled_model = _model(model_cfg, vocab, compile=True, gradient_checkpointing=True)
    compiled = compiled_model.causal_lm.model.layers
    plain_model = _model(model_cfg, vocab)
    assert len(compiled) == model_cfg.mllm.num_hidden_layers
    # the checkpoint wraps the compiled forward from outside (models/recompute.py's forward_state)
    assert all(hasattr(vars(layer)["_animegamer_forward"], "_torchdynamo_orig_callable") for layer in compiled)
    assert not any("forward" in vars(layer) for layer in plain_model.causal_lm.model.layers)
    assert list(compiled_model.state_dict()) == list(plain_model.state_dict())


@pytest.mark.parametrize("every", [1, 2])
def test_recomputed_layers_keep_the_configured_attention_kernels(model_cfg, vocab, monkeypatch, every):
    """With checkpointing, each recomputed layer re-enters the configured SDPA kernel order in backward
    (through ``recompute``'s wrappers, every layer or every k-th)."""
    from attention_helpers import recording_kernel_contexts

    entered = recording_kernel_contexts(monkeypatch)
    model = _model(model_cfg, vocab, gradient_checkpointing=True, gradient_checkpointing_every=every,
                   attention_backends=["efficient", "math"]).train()
    loss = model(**_batch(model_cfg, vocab))["loss"]
    assert entered == []  # the first forward runs under the module's own block, not the recompute context
    loss.backward()
    layers = model_cfg.mllm.num_hidden_layers
    assert entered == [["efficient", "math"]] * -(-layers // every)  # one per recomputed layer
