"""The whole recipe as one call: pipeline -> phase (a1, a2) -> representations -> session shards ->
phase (b) -> adaptation shards -> phase (c) -> evaluation (benchmark games, metrics, report). The quick start and fine-tuning on a new film are two
parameterisations of it; every stage is the same code path as its own command.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from animegamer.config.compose import compose_config

log = logging.getLogger(__name__)


@dataclass
class Recipe:
    pipeline: list[str]  # overrides of the pipeline root (e.g. an experiment and the inputs)
    phase_a: list[str]  # overrides of train.py for both phase (a) stages
    phase_b: list[str]
    phase_c: list[str]
    evaluation: list[str] = field(default_factory=list)  # overrides of evaluate.py; empty = no evaluation
    start_a: str = ""  # an earlier phase (a) export: skip the warm-up, start a_joint from it
    start_b: str = ""  # an earlier phase (b) export to start from
    extra: list[str] = field(default_factory=list)  # overrides for every stage


STORY_TURNS = 5
# What the summary says for a validation metric when the held-out split had nothing for the phase.
NOT_VALIDATED = "not measured (no held-out session: see the phase b log)"


def play_story(composed, out: Path) -> Path:
    """A demonstration game: the trained game plays the instructions of consecutive clips of the film."""
    from omegaconf import OmegaConf

    from animegamer.evaluation import story_instructions
    from animegamer.game import load_game_models, play_game, read_level_flow

    cfg = OmegaConf.to_object(composed)
    e = cfg.evaluation
    models = load_game_models(cfg, e.mllm_export, e.renderer_export,
                              read_level_flow(Path(cfg.data.root) / cfg.data.clips / "manifest.json"))
    try:
        play_game(models, story_instructions(cfg, STORY_TURNS), out, seed=cfg.seed, overwrite=True)
    except ValueError as error:  # a malformed state generation ends the game; game.json records it
        log.warning("the demonstration game stopped: %s", error)
    return out / "index.html"


def run_recipe(recipe: Recipe) -> dict:
    from animegamer.training.runner import run as run_train
    from data_pipeline.__main__ import run as run_pipeline

    pipe = lambda *o: run_pipeline(compose_config("pipeline", [*recipe.pipeline, *o, *recipe.extra]))
    train = lambda stage, *o: run_train(compose_config("train", [*stage, *o, *recipe.extra]))

    clips = pipe()
    start_a = recipe.start_a
    if not start_a:
        start_a = train(recipe.phase_a, "phase=a_warmup")["export"]
    joint = train(recipe.phase_a, "phase=a_joint", f"phase.init_from={start_a}")
    reps = pipe("pipeline.steps=[representations,session_shards]",
                f"pipeline.representations.export={joint['export']}")
    game = train(recipe.phase_b, *([f"phase.init_from={recipe.start_b}"] if recipe.start_b else []))
    adaptation = pipe("pipeline.steps=[adaptation]", f"pipeline.adaptation.export={game['export']}")
    adapted = train(recipe.phase_c, f"phase.init_from={joint['export']}")
    report, story = None, None
    if recipe.evaluation:
        from animegamer.evaluation import run as run_evaluation

        root = Path(adapted["export"]).parent.parent
        evaluation = compose_config("evaluate", [
            *recipe.evaluation, f"evaluation.mllm_export={game['export']}",
            f"evaluation.renderer_export={adapted['export']}", f"evaluation.reconstruction_export={joint['export']}",
            *recipe.extra, f"evaluation.out={root / 'eval'}"])
        report = run_evaluation(evaluation)
        story = play_story(evaluation, root / "game")
    summary = {
        "clip shards": clips["output"],
        "report": str(Path(clips["output"]).parent / "report.json"),
        "features": clips.get("features", {}).get("output"),
        "sessions": clips.get("sessions", {}).get("output"),
        "phase a start": start_a,
        "phase a2 export": joint["export"],
        "phase a2 val/loss": joint["metrics"].get("val/loss"),
        "representations": reps["representations"]["output"],
        "session shards": reps["session_shards"]["output"],
        "phase b export": game["export"],
        "phase b val/state_accuracy": game["metrics"].get("val/state_accuracy", NOT_VALIDATED),
        "adaptation shards": adaptation["adaptation"]["output"],
        "phase c export": adapted["export"],
        "evaluation report": report["files"].get("report_md") if report else None,
        "evaluation games": str(Path(report["out"]) / "games") if report else None,
        "5-turn game": str(story) if story else None,
    }
    for name, value in summary.items():
        log.info("%-26s %s", name, value)
    return summary
