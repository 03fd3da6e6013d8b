"""Batched play (evaluation.batch_games): several games through one MLLM prefill, one sampler batch and one
VAE decode give every game what it gets played alone, on tiny random networks on the CPU."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from animegamer.config.compose import compose_config
from animegamer.game.models import GameModels
from animegamer.game.scheduler import play_game, play_games

HEIGHT, WIDTH = 32, 48
LEVEL_FLOW = {1: 0.25, 2: 1.5, 3: 4.0, 4: 12.0, 5: 30.0}
# Constrained decoding: an untrained MLLM still generates valid states, so every turn reaches the renderer.
OVERRIDES = ["model=tiny", f"pipeline.clips.height={HEIGHT}", f"pipeline.clips.width={WIDTH}",
             "model.mllm.constrained_states=true", "model.diffusion.sampling_steps=2"]
# Unequal games: lengths 3, 1, 4, 2 and an empty instruction that stops the fifth at its second turn.
SCRIPTS = [
    [f"Character: Qiqi; Motion: walk {k}; Background: town at hour {k}." for k in range(3)],
    ["Character: Sosuke; Motion: a long leap over the river and a wave; Background: forest."],
    [f"Character: Kiki; Motion: fly {'far ' * k}; Background: sky." for k in range(4)],
    ["Character: Totoro; Motion: yawn; Background: tree.", "Character: Totoro; Motion: sleep; Background: tree."],
    ["Character: Jiji; Motion: sit; Background: window.", "   ", "Character: Jiji; Motion: never played."],
]
REP_TOLERANCE = 1e-5  # float32 on the CPU: batched and single rows may take other kernel blockings
FRAME_TOLERANCE = 1  # uint8: the representations differ by ~2e-7 (left-padded prefill), which can round a pixel the other way


@pytest.fixture(scope="module")
def models():
    from animegamer.models.frozen_encoders import build_frozen_encoders
    from animegamer.models.reconstruction import ReconstructionModel
    from animegamer.phases.phase_b import PhaseB

    cfg = OmegaConf.to_object(compose_config("train", OVERRIDES))
    torch.manual_seed(0)
    mllm = PhaseB(cfg).eval().requires_grad_(False)
    renderer = ReconstructionModel(cfg).eval().requires_grad_(False)
    vae = build_frozen_encoders(cfg.model.encoders, which=("vae",)).vae
    played = OmegaConf.to_object(compose_config("evaluate", OVERRIDES))  # the evaluation's config plays them
    return GameModels(mllm, renderer, vae, LEVEL_FLOW, played)


def sequential(models, root: Path, scripts=SCRIPTS) -> list[SimpleNamespace]:
    """Today's path: one game after another through play_game."""
    games = []
    for number, script in enumerate(scripts):
        results = []
        try:
            record = play_game(models, script, root / str(number), seed=7, window_turns=3, on_turn=results.append)
            error = None
        except ValueError as raised:
            error = str(raised)
            record = json.loads((root / str(number) / "game.json").read_text())
        games.append(SimpleNamespace(record=record, results=results, error=error))
    return games


def batched_play(models, root: Path, scripts=SCRIPTS) -> tuple[list, list[int]]:
    """The games played 3 at a time, and the batch of every decoder call."""
    batch_sizes: list[int] = []
    hook = models.renderer.decoder.register_forward_pre_hook(lambda m, args: batch_sizes.append(args[0].shape[0]))
    try:
        batched = play_games(models, scripts, [root / "batched" / str(n) for n in range(len(scripts))], seed=7,
                             batch_games=3, window_turns=3)
    finally:
        hook.remove()
    return batched, batch_sizes


@pytest.fixture(scope="module")
def played(models, tmp_path_factory):
    root = tmp_path_factory.mktemp("played")
    alone = sequential(models, root / "alone")
    batched, batch_sizes = batched_play(models, root)
    return SimpleNamespace(alone=alone, batched=batched, root=root, batch_sizes=batch_sizes)


def without_timings(record: dict) -> dict:
    record = json.loads(json.dumps(record))
    record.pop("seconds_per_turn")
    for turn in record["turns"]:
        turn.pop("timings")
    return record


def test_batched_games_equal_games_played_alone(played):
    rep_diff, frame_diff, turns = 0.0, 0, 0
    for alone, batched in zip(played.alone, played.batched, strict=True):
        assert [r.index for r in batched.results] == [r.index for r in alone.results]
        for a, b in zip(alone.results, batched.results):
            assert (a.tokens, a.predicted, a.states_before, a.states_after, a.seed, a.flow) == \
                (b.tokens, b.predicted, b.states_before, b.states_after, b.seed, b.flow)
            rep_diff = max(rep_diff, float((a.rep - b.rep).abs().max()))
            frame_diff = max(frame_diff, int(np.abs(a.frames.astype(int) - b.frames.astype(int)).max()))
            turns += 1
        assert without_timings(batched.record) == without_timings(alone.record)  # game.json, error included
        assert (None if batched.error is None else str(batched.error)) == alone.error
    assert turns == 3 + 1 + 4 + 2 + 1
    assert rep_diff <= REP_TOLERANCE and frame_diff <= FRAME_TOLERANCE, (rep_diff, frame_diff)


def test_with_the_step_cache_batched_games_still_equal_games_played_alone(models, played, tmp_path):
    """The step cache decides per batch which steps to skip, so batched play samples each game's turn
    alone (the decoder never sees two games at once): the same clips as alone (with the cache), and not
    the uncached clips (it did skip)."""
    from dataclasses import replace

    diffusion = replace(models.cfg.model.diffusion, cache="first_block", cache_threshold=1e9)
    cached = replace(models, cfg=replace(models.cfg, model=replace(models.cfg.model, diffusion=diffusion)))
    alone = sequential(cached, tmp_path / "alone", SCRIPTS[:3])
    batched, batch_sizes = batched_play(cached, tmp_path, SCRIPTS[:3])
    assert set(batch_sizes) == {2}  # one game's two guidance branches per call, never several games
    frame_diff, from_uncached = 0, 0
    for one, game, uncached in zip(alone, batched, played.alone):
        assert without_timings(game.record) == without_timings(one.record)
        assert one.record["sampling"]["cache"] == "first_block"
        for a, b, u in zip(one.results, game.results, uncached.results, strict=True):
            frame_diff = max(frame_diff, int(np.abs(a.frames.astype(int) - b.frames.astype(int)).max()))
            from_uncached = max(from_uncached, int(np.abs(b.frames.astype(int) - u.frames.astype(int)).max()))
    assert frame_diff <= FRAME_TOLERANCE, frame_diff
    assert from_uncached > FRAME_TOLERANCE, from_uncached


def test_unequal_games_leave_the_batch_and_the_next_game_joins(played):
    """Turn by turn, the decoder's batch (CFG doubles it) holds the games still playing, at most 3:
    games 0-2 start; game 1 (one turn) leaves and game 3 takes its slot in the next turn; games 0 and 3
    end together and game 4 joins game 2, then stops at its empty instruction (no decoder call)."""
    steps = played.alone[0].record["sampling"]["steps"]
    per_turn = [size // 2 for size in played.batch_sizes[::steps]]
    assert played.batch_sizes == [2 * n for n in per_turn for _ in range(steps)]
    assert per_turn == [3, 3, 3, 2]
    assert sum(per_turn) == sum(len(g.results) for g in played.batched)
    stopped = played.batched[4]
    assert len(stopped.results) == 1 and "turn 1: the instruction must be a non-empty string" in str(stopped.error)
    assert sorted(p.name for p in (played.root / "batched" / "4").glob("turn_*.mp4")) == ["turn_000.mp4"]


def test_batched_timings_share_the_stages(played):
    for game in played.batched:
        for result in game.results:
            t = result.timings
            assert t["total"] == pytest.approx(t["mllm"] + t["sample"] + t["vae_decode"]) and t["sample"] > 0


def test_batch_games_is_validated(models, tmp_path):
    from animegamer.evaluation.preflight import validate_eval_run
    from animegamer.config.validate import ConfigError

    with pytest.raises(ValueError, match=r"batch_games=0: must be a whole number >= 1"):
        play_games(models, SCRIPTS[:1], [tmp_path], batch_games=0)
    composed = compose_config("evaluate", ["evaluation.batch_games=0"])
    with pytest.raises(ConfigError, match=r"evaluation\.batch_games=0: must be a whole number >= 1"):
        validate_eval_run(composed)
    assert OmegaConf.to_object(compose_config("evaluate", [])).evaluation.batch_games == 1


def test_play_benchmark_batched_equals_sequential(models, tmp_path, monkeypatch):
    """evaluate.py's play_benchmark at batch_games 1 and 4: the same report rows (states, metrics) and turns."""
    from dataclasses import replace

    from animegamer.evaluation import runner as evaluation

    rng = np.random.default_rng(0)
    benchmark = {"games": [{"id": f"g{n}", "turns": [
        {"key": f"g{n}_{k}", "instruction": text, "environment": "town", "level": 1 + k % 5,
         "states": {"ML": 1 + k % 5, "SC": 0, "ET": 1, "ST": -1}} for k, text in enumerate(script)]}
        for n, script in enumerate(SCRIPTS[:4])]}
    keys = {t["key"] for g in benchmark["games"] for t in g["turns"]}
    truth = {key: rng.integers(0, 256, (HEIGHT, WIDTH, 3), dtype=np.uint8) for key in sorted(keys)}
    monkeypatch.setattr(evaluation, "first_frames", lambda cfg, wanted: {k: truth[k] for k in wanted})
    monkeypatch.setattr(evaluation, "write_truth_clips", lambda cfg, wanted, folder: {})
    scorers = evaluation.Scorers(models.cfg)

    def play(batch_games: int):
        cfg = replace(models.cfg, evaluation=replace(models.cfg.evaluation, batch_games=batch_games, sampling_steps=2))
        games, turns = evaluation.play_benchmark(cfg, models, benchmark, tmp_path / str(batch_games), scorers)
        for game in games:
            for row in game["turns"]:
                row["video"] = Path(row["video"]).relative_to(tmp_path / str(batch_games)).as_posix()
        return games, turns

    (one, one_turns), (four, four_turns) = play(1), play(4)
    assert one == four and [g["completed"] for g in four] == [3, 1, 4, 2]
    assert len(one_turns) == len(four_turns) == 10
    for a, b in zip(one_turns, four_turns):
        assert a["truth"] == b["truth"] and a["result"].predicted == b["result"].predicted
        assert int(np.abs(a["result"].frames.astype(int) - b["result"].frames.astype(int)).max()) <= FRAME_TOLERANCE


def test_throughput_benchmark_rehearsal(tmp_path):
    """benchmarks/evaluation_throughput.py on tiny models: turns per hour by batch size, and game 0's first
    turn at batch 2 against batch 1 (the same states; frames within one 8-bit level)."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": f"{root / 'src'}:{os.environ.get('PYTHONPATH', '')}"}
    out = tmp_path / "throughput.json"
    done = subprocess.run([sys.executable, "benchmarks/evaluation_throughput.py", "--tiny", "--batches", "1", "2",
                           "--warmup", "0", "--rounds", "1", "--out", str(out)], cwd=root, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    runs = result["runs"]
    assert set(runs) == {"1", "2"} and all(len(runs[b]["rounds"]) == 1 for b in runs)
    for batch, row in runs.items():
        assert row["turns_per_hour"] == pytest.approx(int(batch) * 3600 / row["median"]["seconds"], rel=1e-3)
        assert row["at_config_steps"]["steps"] == 4 and row["steps"] == 2 and row["at_config_steps"]["estimated"]
    assert runs["2"]["equal_to_alone"]["states"] and runs["2"]["equal_to_alone"]["frames_max_diff"] <= FRAME_TOLERANCE
    assert result["speedup"]["2"]["measured"] == pytest.approx(runs["2"]["turns_per_hour"] / runs["1"]["turns_per_hour"],
                                                               rel=1e-2)
