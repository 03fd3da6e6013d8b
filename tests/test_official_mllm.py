"""Importer of the official MLLM checkpoint against the golden case computed with the official code.

``shared/reference/official_mllm_golden`` holds one phase-(b) training sequence run through the
official ``ContinuousLVLM_Video`` (peft-wrapped Mistral, tiny random weights, float32, CPU): its
state dict with the official key names, the sequence, the representations and the outputs. The
importer must place every official key, fill every module parameter, and reproduce the losses, the
predicted representation and the logits of the state tokens.
"""
from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from animegamer.config.schema import MLLMConfig
from animegamer.models.mllm import GameStateMLLM
from animegamer.models.official_mllm import load_official_mllm, official_canonical_name, read_official_mllm_state_dict

logger = logging.getLogger(__name__)

GOLDEN = Path(__file__).resolve().parents[2] / "shared" / "reference" / "official_mllm_golden"
CHECKPOINT = GOLDEN / "pytorch_model.bin"
RELATIVE_TOLERANCE = 1e-5  # max |ours - expected| / max |expected|
# PyTorch's default CPU SDPA kernel (blocked online softmax) sums in another order than the
# official eager attention: ~1e-5 on this case. The exact comparisons use eager or SDPA's math kernel.
FUSED_SDPA_TOLERANCE = 1e-4

pytestmark = pytest.mark.skipif(not CHECKPOINT.is_file(), reason=f"golden case not present: {GOLDEN}")


@pytest.fixture(scope="module")
def case() -> dict:
    return json.loads((GOLDEN / "case.json").read_text())


@pytest.fixture(scope="module")
def official_state() -> dict[str, torch.Tensor]:
    return torch.load(CHECKPOINT, map_location="cpu", weights_only=True)


@pytest.fixture(scope="module")
def arrays() -> dict[str, torch.Tensor]:
    names = ("video_embeds", "expected_pred", "expected_label_logits")
    return {name: torch.from_numpy(np.load(GOLDEN / f"{name}.npy", allow_pickle=False)) for name in names}


def _config(case: dict, **changes) -> MLLMConfig:
    llm = case["llm_config"]
    sizes = {k: llm[k] for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                 "num_attention_heads", "num_key_value_heads", "max_position_embeddings",
                                 "rms_norm_eps", "rope_theta", "sliding_window")}
    values = dict(sizes, lora_rank=case["lora"]["r"], lora_alpha=float(case["lora"]["alpha"]),
                  lora_dropout=case["lora"]["dropout"], attention="eager")
    values.update(changes)
    return MLLMConfig(**values)


def _build(case: dict, lora: bool = True, seed: int = 1, **changes) -> GameStateMLLM:
    model = GameStateMLLM(_config(case, **changes), case["rep_dim"], case["num_query_tokens"], case["vocab_size"],
                          seed=seed, lora=lora)
    return model.eval()


def _golden_mask(query_mask: torch.Tensor) -> torch.Tensor:
    """(1, 1, L, L) additive mask: causal, except the query block attends to itself both ways."""
    length = query_mask.shape[-1]
    allowed = torch.ones(length, length, dtype=torch.bool).tril()
    allowed |= query_mask[0][:, None] & query_mask[0][None, :]
    mask = torch.zeros(length, length).masked_fill(~allowed, torch.finfo(torch.float32).min)
    return mask[None, None]


def _batch(case: dict, arrays: dict) -> dict[str, torch.Tensor]:
    """The golden sequence as model inputs (written from case.json alone, independent of animegamer.mllm)."""
    input_ids = torch.tensor([case["input_ids"]])
    query_mask = torch.tensor([case["query_mask"]])
    history_mask = torch.tensor([case["history_mask"]])
    reps = arrays["video_embeds"]  # (1, turns, N, D); the last turn is the target
    history_index = torch.full_like(input_ids, -1)
    history_index[history_mask] = torch.arange(int(history_mask.sum()))  # turn by turn, frame by frame
    labels = input_ids.clone()
    labels[:, : case["labels_from_index"]] = -100
    return dict(input_ids=input_ids, attention_mask_4d=_golden_mask(query_mask), history_reps=reps[:, :-1],
                history_index=history_index, query_mask=query_mask, labels=labels, target_rep=reps[:, -1])


def _relative_error(ours: torch.Tensor, expected: torch.Tensor) -> float:
    return ((ours.float() - expected.float()).abs().max() / expected.float().abs().max()).item()


def _errors(case: dict, arrays: dict, out: dict) -> dict[str, float]:
    expected = case["expected"]
    return {
        "lm_loss": abs(out["lm_loss"].item() - expected["lm_loss"]) / abs(expected["lm_loss"]),
        "rec_loss": abs(out["rec_loss"].item() - expected["rec_loss"]) / abs(expected["rec_loss"]),
        "total_loss": abs(out["loss"].item() - expected["total_loss"]) / abs(expected["total_loss"]),
        "pred": _relative_error(out["pred"], arrays["expected_pred"]),
        "label_logits": _relative_error(out["label_logits"], arrays["expected_label_logits"]),
    }


def _run(model: GameStateMLLM, case: dict, arrays: dict) -> dict[str, float]:
    with torch.no_grad():
        out = model(**_batch(case, arrays))
    return _errors(case, arrays, out)


# --------------------------------------------------------------------------- parity
@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_official_mllm_reproduces_golden_case(case, arrays, official_state, attention):
    model = _build(case, attention=attention)
    report = load_official_mllm(official_state, model)
    assert report.unplaced_keys == [] and report.unset_parameters == [], report.summary()
    assert report.ok
    originals = [k for k in official_state if ".original_module." in k]
    assert len(originals) == 2 * case["llm_config"]["num_hidden_layers"] + 1
    assert report.known_unused == sorted(originals)
    with sdpa_kernel(SDPBackend.MATH):
        errors = _run(model, case, arrays)
    logger.info("golden MLLM (%s): relative errors %s", attention, errors)
    assert max(errors.values()) <= RELATIVE_TOLERANCE, errors
    assert _batch(case, arrays)["labels"].ne(-100).sum() == arrays["expected_label_logits"].shape[0]


def test_default_sdpa_kernel_and_default_mask(case, arrays, official_state):
    """The fused CPU SDPA kernel, and the mask built inside the model from query_mask alone."""
    model = _build(case, attention="sdpa")
    load_official_mllm(official_state, model)
    batch = _batch(case, arrays)
    batch["attention_mask_4d"] = None
    with torch.no_grad():
        errors = _errors(case, arrays, model(**batch))
    logger.info("golden MLLM (fused sdpa, default mask): relative errors %s", errors)
    assert max(errors.values()) <= FUSED_SDPA_TOLERANCE, errors


def test_official_mllm_from_file_and_folder(case, arrays):
    for source in (CHECKPOINT, GOLDEN):
        model = _build(case)
        assert load_official_mllm(source, model).ok
        assert max(_run(model, case, arrays).values()) <= RELATIVE_TOLERANCE
    assert set(read_official_mllm_state_dict(GOLDEN)) == set(case["state_dict_keys"])


def test_official_mllm_into_a_model_without_lora_gets_an_adapter(case, arrays, official_state):
    model = _build(case, lora=False)
    report = load_official_mllm(official_state, model)
    assert report.ok and model.has_lora and any("added a rank-" in n for n in report.notes)
    assert max(_run(model, case, arrays).values()) <= RELATIVE_TOLERANCE


@pytest.mark.parametrize("fresh_adapter", [False, True], ids=["no-adapter", "fresh-adapter"])
def test_official_lora_merged_into_base_weights(case, arrays, official_state, fresh_adapter):
    """merge_lora: the official LoRA folded into the base weights; a fresh adapter (B = 0) adds nothing."""
    model = _build(case, lora=fresh_adapter)
    report = load_official_mllm(official_state, model, merge_lora=True)
    assert report.ok, report.summary()
    assert model.has_lora is fresh_adapter
    assert max(_run(model, case, arrays).values()) <= RELATIVE_TOLERANCE


def test_merge_lora_after_import_keeps_the_network(case, arrays, official_state):
    model = _build(case)
    load_official_mllm(official_state, model)
    model.merge_lora()
    assert not model.has_lora and model.lora_parameters() == []
    assert max(_run(model, case, arrays).values()) <= RELATIVE_TOLERANCE


def test_import_rescales_lora_to_another_alpha(case, arrays, official_state):
    """A model configured with another LoRA alpha still computes the official network."""
    model = _build(case, lora_alpha=2.0)
    report = load_official_mllm(official_state, model, official_lora_alpha=float(case["lora"]["alpha"]))
    assert report.ok and any("rescaled" in n for n in report.notes)
    assert max(_run(model, case, arrays).values()) <= RELATIVE_TOLERANCE


# --------------------------------------------------------------------------- naming variants
def _old_peft_naming(state: dict) -> dict:
    """Older peft: no ``base_layer`` (the wrapped Linear owned the weight), LoRA without adapter name."""
    renamed = {}
    for key, value in state.items():
        key = key.replace(".base_layer.", ".")
        key = re.sub(r"\.(lora_[AB])\.default\.weight$", r".\1.weight", key)
        renamed[key] = value
    return renamed


def _plain_norm_naming(state: dict) -> dict:
    """Norms saved as plain weights (no modules_to_save copies)."""
    return {key.replace(".modules_to_save.default.", "."): value for key, value in state.items()
            if ".original_module." not in key}


@pytest.mark.parametrize("variant", [_old_peft_naming, _plain_norm_naming], ids=["old-peft", "plain-norms"])
def test_other_namings_load_identically(case, arrays, official_state, variant):
    reference = _build(case)
    assert load_official_mllm(official_state, reference).ok
    renamed = variant(official_state)
    assert set(renamed) != set(official_state)
    model = _build(case, seed=2)  # other random weights: everything must be overwritten
    report = load_official_mllm(renamed, model)
    assert report.unplaced_keys == [] and report.unset_parameters == [], report.summary()
    ours, theirs = model.state_dict(), reference.state_dict()
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)


def test_plain_hugging_face_prefixes_are_understood():
    assert official_canonical_name("llm.base_model.model.model.layers.3.self_attn.q_proj.base_layer.weight") == (
        "llm.model.layers.3.self_attn.q_proj.weight", "param")
    assert official_canonical_name("base_model.model.lm_head.weight") == ("llm.lm_head.weight", "param")
    assert official_canonical_name("model.norm.weight") == ("llm.model.norm.weight", "param")
    assert official_canonical_name("llm.base_model.model.model.layers.0.mlp.up_proj.lora_B.default.weight") == (
        "llm.model.layers.0.mlp.up_proj.lora_B.weight", "lora")
    assert official_canonical_name("llm.base_model.model.model.norm.original_module.weight") == (None, "original")
    assert official_canonical_name("output_resampler.proj.2.bias") == ("output_proj.2.bias", "param")
    assert official_canonical_name("visual_encoder.weight") == (None, "unknown")


# --------------------------------------------------------------------------- what the report shows
def test_report_lists_unplaced_and_unset(case, official_state):
    state = dict(official_state)
    state["llm.base_model.model.model.layers.0.self_attn.bogus.weight"] = torch.zeros(3)
    state["image_head.weight"] = torch.zeros(2)
    del state["output_resampler.proj.2.bias"]
    report = load_official_mllm(state, _build(case))
    assert not report.ok
    assert report.unplaced_keys == ["image_head.weight", "llm.base_model.model.model.layers.0.self_attn.bogus.weight"]
    assert report.unset_parameters == ["output_proj.2.bias"]


def test_lora_half_without_partner_is_reported(case, official_state):
    key = "llm.base_model.model.model.layers.1.mlp.up_proj.lora_B.default.weight"
    state = {k: v for k, v in official_state.items() if k != key}
    report = load_official_mllm(state, _build(case))
    assert report.unplaced_keys == [key.replace("lora_B", "lora_A")]
    assert sorted(report.unset_parameters) == [key.replace("lora_B", "lora_A"), key]


def test_import_refuses_other_sizes(case, official_state):
    model = GameStateMLLM(_config(case), case["rep_dim"] + 1, case["num_query_tokens"], case["vocab_size"])
    with pytest.raises(ValueError, match="do not fit"):
        load_official_mllm(official_state, model)


# --------------------------------------------------------------------------- inference on the golden prompt
def test_generation_prefill_gives_the_golden_rep_and_first_state_token(case, arrays, official_state):
    """The prompt (up to <ML>) holds the query block: its prefill gives the official pred, and the
    first greedy token is the argmax of the official logits at the <ML> position."""
    model = _build(case)
    load_official_mllm(official_state, model)
    batch = _batch(case, arrays)
    cut = case["labels_from_index"]
    prompt_mask = batch["attention_mask_4d"][..., :cut, :cut]
    out = model.generate_states(batch["input_ids"][:, :cut], prompt_mask, batch["history_reps"],
                                batch["history_index"][:, :cut], batch["query_mask"][:, :cut], max_new_tokens=3)
    assert out["tokens"].shape == (1, 3)
    assert _relative_error(out["pred"], arrays["expected_pred"]) <= RELATIVE_TOLERANCE
    assert out["tokens"][0, 0].item() == arrays["expected_label_logits"][0].argmax().item()
