"""The held-out split is whole shots, the same for every phase and for evaluation."""
from __future__ import annotations

import json

from omegaconf import OmegaConf

from animegamer.config.compose import compose_config
from animegamer.data.phase_a import phase_a_dataset
from animegamer.data.split import HeldOut, session_key


def test_held_out_shots_are_never_trained_on(toy_run):
    output, _ = toy_run
    cfg = OmegaConf.to_object(compose_config("train", ["model=tiny", f"data.root={output}", "data.val_fraction=0.3"]))
    shots = json.loads((output / "clips" / "shots.json").read_text())
    split = HeldOut(output, "clips", 0.3)
    held_shots = {shot for key, shot in shots.items() if split.clip(key)}
    assert held_shots and len(held_shots) < len(set(shots.values()))
    train = set(phase_a_dataset(cfg, "train").keys())
    val = set(phase_a_dataset(cfg, "val").keys())
    assert train.isdisjoint(val) and train | val == set(shots)
    assert {shots[k] for k in val} == held_shots and not {shots[k] for k in train} & held_shots
    # Sessions: training sessions hold no held-out clip; validation sessions hold only held-out clips.
    sessions = json.loads((output / "sessions.json").read_text())["sessions"]
    for session in sessions:
        held = [split.clip(k) for k in session["keys"]]
        key = session_key(session["keys"])
        assert split.keep_session("train")(key) == (not any(held))
        assert split.keep_session("val")(key) == all(held)


def test_evaluation_games_are_made_of_held_out_shots(toy_run):
    from animegamer.evaluation.runner import held_out_games

    output, _ = toy_run
    cfg = OmegaConf.to_object(compose_config("evaluate", ["model=tiny", f"data.root={output}", "data.val_fraction=0.3",
                                                          "evaluation.games=10", "evaluation.turns=5"]))
    split = HeldOut(output, "clips", 0.3)
    games = held_out_games(cfg)["games"]
    assert games and all(split.clip(t["key"]) for g in games for t in g["turns"])
    for game in games:  # consecutive clips of one film, with their true states
        numbers = [int(t["key"].rsplit("-", 1)[1]) for t in game["turns"]]
        assert numbers == list(range(numbers[0], numbers[0] + len(numbers)))
        assert all(set(t["states"]) == {"ML", "SC", "ET", "ST"} for t in game["turns"])
