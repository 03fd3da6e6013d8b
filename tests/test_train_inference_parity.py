"""Phase (b)'s training forward and its two inference paths read the same network on the same inputs.

The game's prompt (:func:`animegamer.mllm.predict.predict_next`) and the adaptation step
(:mod:`data_pipeline.adaptation`, phase (c)'s input) must give, for a turn and its true history, the
representation and state tokens the training forward gives on that window. The model is the tiny
preset with its trainable tensors moved off their initial values (LoRA B is zero at init, so an
untouched model would hide an adapter that is not applied), and the adaptation side loads it from
its export as the pipeline does, seeded runs included.
"""
from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf
from phase_b_helpers import tiny_b_cfg, write_synthetic_sessions

from animegamer.contracts.files import SESSION_SHARDS_DIR
from animegamer.contracts.shards import REPS
from animegamer.data.indexed import IndexedShardDataset
from animegamer.data.phase_b import session_of
from animegamer.mllm.collate import Session, collate_sequences, make_example
from animegamer.mllm.predict import HistoryTurn, generate, predict_next, prompt_batch, state_grammar
from animegamer.mllm.sequence import Turn
from animegamer.models.game_mllm import run_batch
from animegamer.phases.phase_b import PhaseB, export_phase_b
from data_pipeline.adaptation import load_phase_b, predict, targets_with_most_history

TURNS = 4  # per synthetic session; the last turn has 3 turns of history
WINDOW_TURNS = 5  # the game's sliding window: longer than any history here, so nothing is cut
REP_ATOL = 1e-5  # float32 on CPU: the paths differ only in padding and the KV cache


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    return write_synthetic_sessions(tmp_path_factory.mktemp("parity_sessions"), sessions=3, turns=TURNS)


def trained_like(data_root, output, seed: int):
    """A tiny phase (b) module in eval mode whose every trainable tensor is moved off its initial value."""
    composed, cfg = tiny_b_cfg(data_root, output, "model.mllm.lora_dropout=0", f"seed={seed}")
    module = PhaseB(cfg).eval()
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for param in module.model.parameters():
            if param.requires_grad:
                param.add_(0.05 * torch.randn(param.shape, generator=generator))
    return composed, module


def sessions_of(data_root) -> IndexedShardDataset:
    return IndexedShardDataset(data_root / SESSION_SHARDS_DIR, lambda s: s, video=False)


def training_forward(module, window: Session) -> dict:
    with torch.no_grad():
        return run_batch(module.model, collate_sequences([make_example(module.ids, module.tokenizer, window)],
                                                         pad_id=module.ids.pad))


def window_of(session: Session, turn: int) -> Session:
    return Session(session.turns[: turn + 1], session.reps[: turn + 1], key=session.key)


def test_game_prompt_gives_the_training_forwards_rep_and_state_tokens(data_root, tmp_path):
    _, module = trained_like(data_root, tmp_path, seed=0)
    window = window_of(session_of(sessions_of(data_root).raw(0)), TURNS - 1)
    history = [HistoryTurn(t, torch.as_tensor(r).float()) for t, r in zip(window.turns[:-1], window.reps[:-1])]
    args = (module.model, module.tokenizer, module.ids, history, window.turns[-1].instruction, WINDOW_TURNS)
    prediction = predict_next(*args, constrained=True)
    trained = training_forward(module, window)
    assert (trained["pred"][0] - prediction.rep).abs().max() <= REP_ATOL
    # The training forward teacher-forced with the generated states picks, under the same grammar,
    # the same token at each of the 12 positions as the KV-cache loop did.
    forced = Session([*window.turns[:-1], Turn(window.turns[-1].instruction, prediction.states)], window.reps)
    logits = training_forward(module, forced)["label_logits"]
    grammar = state_grammar(module.ids)
    assert logits.shape[0] == len(grammar)
    picked = [allowed[int(logits[i, allowed].argmax())] for i, allowed in enumerate(grammar)]
    assert picked == prediction.tokens
    # Free decoding: the first generated token is the training forward's argmax over the vocabulary.
    tokens, _ = generate(module.model, module.ids, prompt_batch(*args))
    assert tokens[0] == int(trained["label_logits"][0].argmax())


@pytest.mark.parametrize("seed", [0, 1])
def test_adaptation_predicts_each_clip_as_the_training_forward_on_its_window(data_root, tmp_path, seed):
    """From the export (seed 1: the frozen random LLM must be rebuilt with the run's seed), batched
    over windows of different lengths, each prediction stored under its own clip's key."""
    composed, module = trained_like(data_root, tmp_path, seed)
    export = export_phase_b(module, tmp_path / "export", {"config": OmegaConf.to_container(composed, resolve=True)})
    loaded = load_phase_b(module.cfg.model, export, "cpu")
    sessions = sessions_of(data_root)
    jobs = list(targets_with_most_history(sessions).items())
    assert {turn for _, (_, turn) in jobs} == set(range(TURNS))  # windows of 1..TURNS turns in one batch
    predicted = predict(loaded, sessions, jobs)
    for (key, (index, turn)), rep in zip(jobs, predicted, strict=True):
        sample = sessions.raw(index)
        assert sample["json"]["keys"][turn] == key
        expected = training_forward(module, window_of(session_of(sample), turn))["pred"][0]
        # the target of that training window is the clip's own rep
        assert torch.equal(torch.as_tensor(sample[REPS][turn]).float(),
                           collate_sequences([make_example(module.ids, module.tokenizer,
                                                           window_of(session_of(sample), turn))],
                                             pad_id=module.ids.pad)["target_rep"][0])
        assert (expected - torch.as_tensor(rep)).abs().max() <= REP_ATOL, (key, seed)


def test_the_game_rebuilds_the_network_the_export_was_trained_on_whatever_its_own_seed(data_root, tmp_path):
    """The game and the evaluation load the export with their own config, whose seed may differ from the
    training run's: the frozen random LLM must still be the trained run's (seed 1 here, the game's 0)."""
    from dataclasses import replace

    from animegamer.models.game_mllm import build_game_mllm

    composed, module = trained_like(data_root, tmp_path, 1)
    export = export_phase_b(module, tmp_path / "export", {"config": OmegaConf.to_container(composed, resolve=True)})
    game_cfg = replace(module.cfg, seed=0)
    loaded = build_game_mllm(game_cfg, [export]).model.eval()
    trained = module.model.state_dict()
    differing = [name for name, value in loaded.state_dict().items() if not torch.equal(value, trained[name])]
    assert differing == []
    # and a build that ignored the export's seed would differ in its frozen weights
    from animegamer.models.game_mllm import build_mllm

    other = build_mllm(game_cfg, len(module.tokenizer)).state_dict()
    assert any(not torch.equal(other[name], trained[name]) for name in other if name in trained)


def test_random_frozen_weights_do_not_depend_on_the_device_the_caller_builds_on(data_root, tmp_path):
    """Lightning's ``init_module`` builds a phase's networks on the GPU; evaluation, the game and the
    pipeline rebuild them on the CPU from the export's seed. CUDA's generator draws other numbers from the
    same seed, so seeded builds draw on the CPU whatever the caller's device (here "cuda:0" on a machine
    without one: a build that drew there would fail) and land where the caller moves them."""
    from animegamer.models.game_mllm import build_mllm
    from animegamer.models.reconstruction import ReconstructionModel

    _, cfg = tiny_b_cfg(data_root, tmp_path, "seed=3")
    vocab = 400
    reference = {"mllm": build_mllm(cfg, vocab).state_dict(), "reconstruction": ReconstructionModel(cfg).state_dict()}
    with torch.device("cuda:0"):
        ambient = {"mllm": build_mllm(cfg, vocab).state_dict(), "reconstruction": ReconstructionModel(cfg).state_dict()}
    for part, state in reference.items():
        assert ambient[part].keys() == state.keys()
        differing = [name for name, value in state.items() if not torch.equal(ambient[part][name], value)]
        assert differing == [], (part, differing[:3])
        assert {value.device.type for value in ambient[part].values()} == {"cpu"}


@pytest.mark.skipif(torch.cuda.is_available(), reason="shows the draw by failing to allocate on a missing GPU")
def test_benchmarks_draw_their_random_weights_on_the_device_they_build_on(data_root, tmp_path):
    """``draw_on_caller_device`` (benchmarks' ``building``) keeps a seeded build where the caller builds:
    here "cuda:0" without a GPU, so the first draw fails to allocate."""
    from animegamer.models.reconstruction import ReconstructionModel
    from animegamer.utils.randomness import draw_on_caller_device

    _, cfg = tiny_b_cfg(data_root, tmp_path, "seed=3")
    with pytest.raises((RuntimeError, AssertionError), match="CUDA"):
        with torch.device("cuda:0"), draw_on_caller_device():
            ReconstructionModel(cfg)
