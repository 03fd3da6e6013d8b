"""``evaluate.py``'s pixel metric and untrained-game baseline on a real tiny run (the toy film's shards,
tiny exports): PSNR of every turn against its held-out clip and of the phase (a) reconstruction against
the shuffled-representation one; the benchmark played again with the MLLM as phase (b) started, as a
baseline row, equal to the game where the export is that start and different where it is not."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf

from conftest import SMALL_CLIPS
from test_pages import _untrained_exports

from animegamer.evaluation.runner import VAE_ROUND_TRIP, VAE_ROUND_TRIP_LABEL
from animegamer.metrics.baselines import COPY_LAST, MAJORITY, SHUFFLED, UNTRAINED
from animegamer.metrics.psnr import PSNR_CAP_DB

SAME_AT_START = ("acc_s", "mae_s", "acc_f", "mae_f", "psnr")  # what the untrained game shares with an untrained export


def _trained_b_export(composed, folder: Path) -> Path:
    """A phase (b) export whose weights moved away from the start that its config records (seed, no
    init_from), as training moves them."""
    from animegamer.checkpoints.export import save_export
    from animegamer.config.compose import carried_over
    from animegamer.phases.phase_b import PhaseB

    composed = carried_over("train", composed)  # the training run that would have made it
    model = PhaseB(OmegaConf.to_object(composed)).model
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in model.parameters():
            if param.requires_grad:
                param.add_(torch.randn(param.shape, generator=generator) * (param.std() + 0.02))
    resolved = OmegaConf.to_container(composed, resolve=True)
    return save_export(folder, model, {"phase": "b", "config": {**resolved, "phase": {"name": "b"}}})


@pytest.fixture(scope="module")
def evaluations(toy_run, tmp_path_factory):
    from animegamer.config.compose import compose_config
    from animegamer.evaluation.reuse import run as run_evaluation  # what animegamer eval runs

    pipeline, _ = toy_run
    root = tmp_path_factory.mktemp("evaluation")
    base = ["experiment=quickstart_eval", f"pipeline.output={pipeline}", "data.sessions=clips", *SMALL_CLIPS,
            "evaluation.untrained_game=true", "evaluation.turns=2"]
    exports = _untrained_exports(compose_config("evaluate", base), root / "run")
    trained_b = _trained_b_export(compose_config("evaluate", base), root / "run" / "b_trained" / "export")

    def evaluate(mllm: Path, out: str, *extra: str) -> dict:
        overrides = [*base, f"evaluation.mllm_export={mllm}", f"evaluation.renderer_export={exports['c']}",
                     f"evaluation.out={root / out}", *extra]
        run_evaluation(compose_config("evaluate", overrides))
        return json.loads((root / out / "metrics.json").read_text())["metrics"]

    trained = evaluate(trained_b, "trained", "evaluation.games=2", f"evaluation.reconstruction_export={exports['c']}")
    at_start_args = (exports["b"], "at_start", "evaluation.games=1", "evaluation.reconstruction_export=''")
    at_start = evaluate(*at_start_args)
    return SimpleNamespace(root=root, trained=trained, at_start=at_start, again=lambda: evaluate(*at_start_args))


def test_the_command_run_again_with_nothing_changed_reads_its_evaluation_back(evaluations):
    metrics = evaluations.root / "at_start" / "metrics.json"
    written = metrics.stat().st_mtime_ns
    assert evaluations.again() == evaluations.at_start
    assert metrics.stat().st_mtime_ns == written  # read back, not played and written again


def test_every_turn_has_a_psnr_against_its_held_out_clip(evaluations):
    metrics = evaluations.trained
    per_turn = metrics["psnr_per_turn"]
    assert len(per_turn) == metrics["games"]["completed_turns"] > 0
    values = [turn["value"] for turn in per_turn]
    assert all(0.0 < v < PSNR_CAP_DB for v in values), values  # random tiny models: far from the truth
    assert metrics["psnr"]["value"] == pytest.approx(sum(values) / len(values))
    report = (evaluations.root / "trained" / "report.md").read_text()
    assert f"| PSNR (dB) | {metrics['psnr']['value']:.2f} |" in report


def test_game_motion_is_scored_against_the_level_the_game_model_asked_for(evaluations):
    written = json.loads((evaluations.root / "trained" / "metrics.json").read_text())
    metrics, motion = written["metrics"], written["metrics"]["motion"]
    asked = [turn["states"]["ML"] for game in written["games"] for turn in game["turns"]]
    assert motion["requested"] == asked and len(asked) == len(motion["levels"]) > 0
    rendered_as_asked = sum(a == b for a, b in zip(motion["levels"], asked)) / len(asked)
    assert metrics["acc_f_requested"]["value"] == pytest.approx(rendered_as_asked)
    report = (evaluations.root / "trained" / "report.md").read_text()
    asked_right = metrics["states"]["per_state"]["ML"]["acc"]
    assert (f"Rendered at the level the game model asked for: {rendered_as_asked:.3f} of the clips (ACC-F counts "
            f"the true level instead; the model asked for the true level in {asked_right:.3f} of the turns).") in report


def test_fewer_games_or_turns_than_asked_are_named_with_the_reason(toy_run, caplog):
    from animegamer.config.compose import compose_config
    from animegamer.evaluation.runner import held_out_games

    pipeline, _ = toy_run
    base = ["experiment=quickstart_eval", f"pipeline.output={pipeline}", "data.sessions=clips", *SMALL_CLIPS]
    cfg = OmegaConf.to_object(compose_config("evaluate", [*base, "evaluation.games=1", "evaluation.turns=1"]))
    with caplog.at_level("WARNING", logger="animegamer.evaluation.runner"):
        assert len(held_out_games(cfg)["games"]) == 1
    assert "ask for more" not in caplog.text
    cfg = OmegaConf.to_object(compose_config("evaluate", [*base, "evaluation.games=99", "evaluation.turns=99"]))
    with caplog.at_level("WARNING", logger="animegamer.evaluation.runner"):
        games = held_out_games(cfg)["games"]
    turns = [str(len(game["turns"])) for game in games]
    said = f"{len(games)} game{'s' if len(games) > 1 else ''} of {', '.join(turns[:-1])}{' and ' if len(turns) > 1 else ''}"
    assert (f"evaluation: {said}{turns[-1]} turns where evaluation.games=99 and evaluation.turns=99 "
            "ask for more") in caplog.text


def test_reconstruction_has_psnr_beside_its_shuffled_baseline(evaluations):
    reconstruction = evaluations.trained["reconstruction"]
    own, shuffled = reconstruction["psnr"], reconstruction["baselines"][SHUFFLED]["psnr"]
    assert own["available"] and 0.0 < own["value"] < PSNR_CAP_DB
    assert reconstruction["clips"] < 2 or (shuffled["available"] and 0.0 < shuffled["value"] < PSNR_CAP_DB)
    # ACC-F of the reconstructions: each measured against its own clip's level
    motion = reconstruction["motion"]
    assert len(motion["levels"]) == len(motion["targets"]) == reconstruction["clips"]
    assert reconstruction["acc_f"]["value"] == sum(a == b for a, b in zip(motion["levels"], motion["targets"])) / len(
        motion["targets"])
    report = (evaluations.root / "trained" / "reconstruction" / "report.md").read_text()
    assert "PSNR (dB)" in report and reconstruction["baselines"][SHUFFLED]["label"] in report
    # The same motion on the latents: a speed per reconstructed clip and per true clip.
    latent = reconstruction["latent_motion"]
    assert len(latent["generated"]) == len(latent["truth"]) == reconstruction["clips"]
    assert all(speed >= 0.0 for speed in latent["generated"] + latent["truth"])


def test_reconstruction_baselines_score_motion_on_the_same_clips(evaluations):
    """The shuffled representation keeps each clip's motion scope, and the VAE round trip decodes each
    clip's own latents: both are measured against the same targets, so ACC-F separates what the
    representation, the motion scope and the VAE give."""
    reconstruction = evaluations.trained["reconstruction"]
    targets = reconstruction["motion"]["targets"]
    for key in (SHUFFLED, VAE_ROUND_TRIP):
        baseline = reconstruction["baselines"][key]
        if reconstruction["clips"] < 2 and key == SHUFFLED:
            assert not baseline["acc_f"]["available"]
            continue
        assert baseline["motion"]["targets"] == targets
        levels = baseline["motion"]["levels"]
        assert baseline["acc_f"]["value"] == sum(a == b for a, b in zip(levels, targets)) / len(targets)
        assert baseline["psnr"]["available"] and 0.0 < baseline["psnr"]["value"] < PSNR_CAP_DB
    # no decoder and no noise: the round trip is not the reconstruction
    assert reconstruction["baselines"][VAE_ROUND_TRIP]["psnr"]["value"] != reconstruction["psnr"]["value"]
    report = (evaluations.root / "trained" / "reconstruction" / "report.md").read_text()
    assert VAE_ROUND_TRIP_LABEL in report


def test_untrained_game_is_a_baseline_row_played_on_the_same_turns(evaluations):
    metrics = evaluations.trained
    untrained = metrics["baselines"][UNTRAINED]
    assert set(metrics["baselines"]) == {MAJORITY, COPY_LAST, UNTRAINED}
    assert untrained["games"]["planned_turns"] == metrics["games"]["planned_turns"]
    assert untrained["states"]["n"] == 4 * untrained["games"]["completed_turns"]
    assert untrained["seed"] == 0 and untrained["init_from"] == []  # as the export's config records
    for key in ("acc_s", "mae_s", "acc_f", "psnr"):
        assert untrained[key]["available"], key
    played = sorted(p.name for p in (evaluations.root / "trained" / "untrained" / "games").iterdir())
    assert played == sorted(p.name for p in (evaluations.root / "trained" / "games").iterdir())
    report = (evaluations.root / "trained" / "report.md").read_text()
    row = [line for line in report.splitlines() if line.startswith(f"| {untrained['label']} |")]
    assert len(row) == 1 and f"{untrained['acc_s']['value']:.4f}" in row[0]
    assert f"{untrained['psnr']['value']:.2f}" in row[0]


def test_untrained_game_differs_from_a_trained_mllm_and_equals_an_export_of_its_start(evaluations):
    def predictions(run: str) -> list:
        games = sorted((evaluations.root / run).glob("games/*/game.json"))
        return [turn["predicted"] for game in games for turn in json.loads(game.read_text())["turns"]]

    trained, untrained = evaluations.trained, evaluations.trained["baselines"][UNTRAINED]
    # other MLLM weights, same renderer and seeds: other representations, so other clips
    assert untrained["psnr_per_turn"] != trained["psnr_per_turn"]
    assert predictions("trained") != predictions("trained/untrained")
    # an export equal to phase (b)'s start plays exactly the untrained game
    at_start = evaluations.at_start
    for key in SAME_AT_START:
        assert at_start["baselines"][UNTRAINED][key] == at_start[key], key
    assert predictions("at_start") == predictions("at_start/untrained")


def test_the_untrained_game_starts_where_the_export_says_phase_b_started(tmp_path):
    from animegamer.checkpoints.export import recorded_start as phase_b_start
    from animegamer.evaluation.preflight import untrained_game_problems

    def export(name: str, config: dict) -> Path:
        folder = tmp_path / name
        folder.mkdir()
        (folder / "export.json").write_text(json.dumps({"phase": "b", "config": config}))
        (folder / "trained.safetensors").write_bytes(b"")
        return folder

    start = export("start", {"seed": 5})
    after_start = export("b", {"seed": 7, "phase": {"name": "b", "init_from": str(start)}})
    assert phase_b_start(str(start)) == (5, [])
    assert phase_b_start(str(after_start)) == (7, [str(start)])
    assert phase_b_start(str(tmp_path / "none")) == (None, [])  # unrecorded: evaluation's seed, no init

    def problems(mllm: Path, on: bool = True) -> list[str]:
        return untrained_game_problems(SimpleNamespace(evaluation=SimpleNamespace(untrained_game=on,
                                                                                   mllm_export=str(mllm))))

    assert problems(after_start) == []
    gone = export("gone", {"seed": 7, "phase": {"init_from": str(tmp_path / "deleted")}})
    assert len(problems(gone)) == 1 and "phase.init_from" in problems(gone)[0] and "deleted" in problems(gone)[0]
    assert problems(gone, on=False) == []


def test_game_folders_an_evaluation_does_not_play_are_set_aside_not_deleted(tmp_path, caplog):
    """An evaluation into the folder of an earlier one that played more games: the folder then holds only the
    games its record names, and the others are kept beside it."""
    from animegamer.evaluation.runner import set_aside_other_games

    games = tmp_path / "eval" / "games"
    for game in ("film-000001", "film-000002", "film-000003"):
        (games / game).mkdir(parents=True)
        (games / game / "game.json").write_text(game)
    kept = set_aside_other_games(games, {"film-000001"})
    assert sorted(p.name for p in games.iterdir()) == ["film-000001"]
    assert kept == tmp_path / "eval" / "games.earlier-1"
    assert sorted(p.name for p in kept.iterdir()) == ["film-000002", "film-000003"]
    assert (kept / "film-000003" / "game.json").read_text() == "film-000003"
    assert set_aside_other_games(games, {"film-000001"}) is None  # nothing more to move
    (games / "film-000004").mkdir()
    assert set_aside_other_games(games, {"film-000001"}) == tmp_path / "eval" / "games.earlier-2"
    assert "moved to" in caplog.text
