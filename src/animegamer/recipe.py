"""The whole recipe as one call: pipeline -> [VAE] -> pre-flight -> phase (a1, a2) -> representations -> session
shards -> phase (b) -> adaptation shards -> phase (c) -> evaluation (benchmark games, metrics, report).
The quick start and fine-tuning on a new film are two parameterisations of it, and the Table 3 recipe
(:mod:`animegamer.ablations`) runs its phase (a) stages; every stage is the same code path as its own
command.

After the pipeline and before the first training step, :func:`animegamer.preflight.check_recipe`
checks that the data allows every stage (captioned clips, training sessions, held-out shots), so a run
that cannot finish fails in seconds with what to change.

With ``Recipe.vae`` set, the pipeline stops after its clip steps, the preset's frozen VAE is trained on
the training clips (:func:`animegamer.toy_vae.ensure_trained`, reused when already trained from the same
clips and settings) into ``Recipe.vae_out``, and every later stage, precompute included, loads it
(``model.encoders.vae.path``): random frozen VAEs give no pixels back, so pixel metrics need it.

With ``Recipe.decoder_base`` set, after the pipeline (the stage trains on phase (a)'s samples) the whole
plain decoder is pre-trained (phase ``a_base``, :data:`BASE_OVERRIDES`), the stand-in of CogVideoX's
pre-training for presets without its weights, and every later stage loads its export's transformer
folder as ``model.decoder.path``: phases (a) and (c) train adapters over a frozen base, and a random one
gives noise. Phase (a1) still starts from a fresh encoder; the base stage's is discarded.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from animegamer.config.compose import compose_config

if TYPE_CHECKING:
    from animegamer.toy_vae import ToyVAETraining

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
    vae: ToyVAETraining | None = None  # train the frozen VAE after the clips (None: the config's VAE)
    vae_out: str = ""  # its folder (diffusers format); with vae set, required
    # Overrides of train.py for the decoder base stage (phase a_base); None: the config's decoder.
    decoder_base: list[str] | None = None


STORY_TURNS = 5
# What the base stage adds to its overrides: the base is a plain video diffusion transformer.
BASE_OVERRIDES = ("phase=a_base", "model.decoder.motion_scope=false")
# Steps averaged for the base stage's final training loss (one step's is noisy: each draws its own timesteps).
FINAL_LOSS_STEPS = 20
# What the summary says for a validation metric when the held-out split had nothing for the phase.
NOT_VALIDATED = ("not measured in this launch (the stage finished in an earlier one, or it validates nothing: "
                 "no held-out data, phase.val_clips=0 or phase.val_every_n_steps above its steps; see its log)")
# What a played-nothing evaluation says (a model trained too briefly writes states outside the layout).
NO_TURN_PLAYED = ("evaluation: no turn of {planned} was played: every state generation was malformed (the log names "
                  "each); train phase (b) longer, or decode the states within the layout with "
                  "model.mllm.constrained_states=true (finetune --constrained-states)")
SUPERSEDED = ".superseded-"  # a stage's earlier run, set aside when it must start afresh: <folder>.superseded-N


def run_pipeline_step(overrides: list[str]) -> dict:
    """``python -m data_pipeline <overrides>``."""
    from data_pipeline.__main__ import run

    return run(compose_config("pipeline", overrides))


def train_stage(overrides: list[str]) -> dict:
    """``train.py <overrides>``: validated, then trained (resumed, or skipped when already done).

    A stage whose folder holds checkpoints trained on other shards (an earlier stage trained again, and
    the shards made from its export with it) starts afresh, since what it trained on is gone; the earlier
    run is kept beside it (:func:`supersede`), never deleted. A changed setting that alters the training
    still stops the stage, as it stops ``train.py``, with the two ways on."""
    from animegamer.training.run_record import RunFolderChanged, only_data_changed
    from animegamer.training.runner import run

    composed = compose_config("train", overrides)
    try:
        return run(composed)
    except RunFolderChanged as changed:
        if not only_data_changed(changed):
            raise
        kept = supersede(Path(composed.output_dir), composed.lock_wait_seconds)
        log.warning("%s: the shards it trained on changed since its checkpoints (%s); the stage starts afresh, its "
                    "earlier run is kept in %s", composed.output_dir, "; ".join(changed.problems), kept)
        return run(composed)


def supersede(folder: Path, wait_seconds: float) -> Path:
    """Move what ``folder`` holds into the first free ``<folder>.superseded-N`` and return that path. The
    folder's lock is held meanwhile (the lock file itself stays), so no run starts in it half-moved."""
    from animegamer.utils.folder_lock import LOCK_FILE, folder_lock
    from animegamer.utils.io import first_free

    with folder_lock(folder, wait_seconds):
        kept = first_free(lambda n: folder.with_name(f"{folder.name}{SUPERSEDED}{n}"))
        kept.mkdir()
        for entry in folder.iterdir():
            if entry.name != LOCK_FILE:
                entry.rename(kept / entry.name)
    return kept


def evaluation_config(overrides: list[str]):
    return compose_config("evaluate", overrides)


def check_start_clip_size(phase_a, start: str) -> None:
    """Training from an earlier export continues at the clip size it was trained at."""
    from animegamer.config.trained_data import clip_size_of, trained_clip_size
    from animegamer.config.validate import ConfigError

    trained, configured = trained_clip_size(start), clip_size_of(phase_a.pipeline.clips)
    if trained is not None and trained != configured:
        raise ConfigError([f"{start} was trained on clips of {trained}, but this run cuts {configured}: "
                           f"leave pipeline.clips at the trained size ({' '.join(trained.overrides())})"])


def say_if_nothing_played(metrics: dict) -> bool:
    """Log an error when the evaluation planned turns and played none (its report alone would only show
    empty tables); returns whether it did."""
    played = metrics.get("games", {})
    if played.get("planned_turns") and not played.get("completed_turns"):
        log.error(NO_TURN_PLAYED.format(planned=played["planned_turns"]))
        return True
    return False


def play_story(composed, out: Path) -> str:
    """A demonstration game: the trained game plays the instructions of consecutive clips of the film;
    returns its page, with why it stopped when it did before its last turn."""
    from omegaconf import OmegaConf

    from animegamer.config.trained_data import clip_manifest
    from animegamer.evaluation import story_instructions
    from animegamer.game import INDEX_FILE, play_game
    from animegamer.game_models import load_game_models, read_level_flow

    cfg = OmegaConf.to_object(composed)
    e = cfg.evaluation
    models = load_game_models(cfg, e.mllm_export, e.renderer_export,
                              read_level_flow(clip_manifest(cfg.data.root, cfg.data.clips)))
    try:
        play_game(models, story_instructions(cfg, STORY_TURNS), out, seed=cfg.seed, overwrite=True)
    except ValueError as error:  # a malformed state generation ends the game; game.json records it
        log.warning("the demonstration game stopped: %s", error)
        return f"{out / INDEX_FILE} (stopped early: {error})"
    return str(out / INDEX_FILE)


def train_vae_stage(recipe: Recipe) -> dict:
    """The pipeline's clip steps, then the preset's VAE trained on their training clips (or reused)."""
    from omegaconf import OmegaConf

    from animegamer.toy_vae import ensure_trained
    from data_pipeline.known_answer import CLIP_STEPS  # the steps that write the clip shards and manifest

    if not recipe.vae_out:
        raise ValueError("Recipe.vae is set but Recipe.vae_out is empty: name the folder the VAE is written to")
    run_pipeline_step([*recipe.pipeline, f"pipeline.steps=[{','.join(CLIP_STEPS)}]", *recipe.extra])
    cfg = compose_config("train", [*recipe.phase_a, "phase=a_joint", *recipe.extra])
    vae_cfg = OmegaConf.to_object(cfg.model.encoders.vae)
    if vae_cfg.path:
        raise ValueError(f"Recipe.vae is set but model.encoders.vae.path is too ({vae_cfg.path!r}): the VAE "
                         f"stage trains a random build of the preset's sizes; leave the path empty")
    settings = replace(recipe.vae, val_fraction=float(cfg.data.val_fraction))  # never a held-out shot
    return ensure_trained(recipe.vae_out, cfg.data.root, vae_cfg, int(cfg.model.encoders.seed), settings,
                          {"model": str(cfg.model.name)})


def step_losses(run_folder: str | Path) -> list[tuple[int, float]]:
    """A run's per-step training loss (its micro-batches averaged), from its loss history."""
    import json

    from animegamer.training.faults import LOSS_HISTORY

    by_step: dict[int, list[float]] = {}
    for step, _, loss in json.loads((Path(run_folder) / LOSS_HISTORY).read_text()):
        by_step.setdefault(int(step), []).append(float(loss))
    return sorted((step, sum(v) / len(v)) for step, v in by_step.items())


def trained_seconds(export: str | Path) -> float | None:
    """How long the run of ``export`` trained, over all its launches (None: an export from before that
    was recorded)."""
    from animegamer.checkpoints.export import EXPORT_FILE
    from animegamer.config.disk_checks import read_json_object
    from animegamer.training.callbacks import TRAIN_SECONDS

    return (read_json_object(Path(export) / EXPORT_FILE) or {}).get(TRAIN_SECONDS)


def train_base_stage(overrides: list[str], extra: list[str]) -> dict:
    """The decoder base (phase a_base), trained or, when its run finished already, reused; returns its
    run (``export``) and the diffusers folder later stages load (``folder``), its final training loss
    and the seconds it took here."""
    from animegamer.models.decoder import BASE_FOLDER

    stage = [*overrides, *extra, *BASE_OVERRIDES]
    path = compose_config("train", stage).model.decoder.path
    if path:
        raise ValueError(f"Recipe.decoder_base is set but model.decoder.path is too ({path!r}): the base stage "
                         f"pre-trains a random build of the preset's sizes; leave the path empty")
    run = train_stage(stage)
    losses = [loss for _, loss in step_losses(Path(run["export"]).parent)[-FINAL_LOSS_STEPS:]]
    return {"export": run["export"], "folder": str((Path(run["export"]) / BASE_FOLDER).resolve()),
            "train_loss": sum(losses) / len(losses), "seconds": trained_seconds(run["export"])}


def run_recipe(recipe: Recipe) -> dict:
    from animegamer.preflight import check_recipe

    vae_record = None
    if recipe.vae is not None:
        vae_record = train_vae_stage(recipe)
        recipe = replace(recipe, extra=[*recipe.extra, f"model.encoders.vae.path={Path(recipe.vae_out).resolve()}"])
    extra = list(recipe.extra)  # read at each call below: the base stage appends the decoder's path
    pipe = lambda *o: run_pipeline_step([*recipe.pipeline, *o, *extra])
    train = lambda stage, *o: train_stage([*stage, *o, *extra])
    start_a = recipe.start_a
    if start_a:
        check_start_clip_size(compose_config("train", [*recipe.phase_a, "phase=a_joint", *extra]), start_a)

    clips = pipe()
    check_recipe(compose_config("train", [*recipe.phase_a, "phase=a_joint", *extra]),
                 compose_config("train", [*recipe.phase_b, *extra]),
                 evaluation_config([*recipe.evaluation, *extra]) if recipe.evaluation else None)
    base = None
    if recipe.decoder_base is not None:
        base = train_base_stage(recipe.decoder_base, extra)
        extra.append(f"model.decoder.path={base['folder']}")
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
        from animegamer.evaluation_reuse import evaluate_or_reuse

        root = Path(adapted["export"]).parent.parent
        evaluation = evaluation_config([
            *recipe.evaluation, f"evaluation.mllm_export={game['export']}",
            f"evaluation.renderer_export={adapted['export']}", f"evaluation.reconstruction_export={joint['export']}",
            *extra, f"evaluation.out={root / 'eval'}"])
        report = evaluate_or_reuse(evaluation)
        say_if_nothing_played(report["metrics"])
        story = play_story(evaluation, root / "game")
    summary = {
        "vae": recipe.vae_out or None,
        "vae held-out PSNR": vae_record["held_out_psnr"] if vae_record else None,
        "decoder base": base["folder"] if base else None,
        "decoder base export": base["export"] if base else None,
        "decoder base train/loss": base["train_loss"] if base else None,
        "decoder base seconds": base["seconds"] if base else None,
        "clip shards": clips["output"],
        "report": str(Path(clips["output"]).parent / "report.json"),
        "features": clips.get("features", {}).get("output"),
        "sessions": clips.get("sessions", {}).get("output"),
        "phase a start": start_a,
        "phase a2 export": joint["export"],
        "phase a2 val/loss": joint["metrics"].get("val/loss", NOT_VALIDATED),
        "representations": reps["representations"]["output"],
        "session shards": reps["session_shards"]["output"],
        "phase b export": game["export"],
        "phase b val/state_accuracy": game["metrics"].get("val/state_accuracy", NOT_VALIDATED),
        "adaptation shards": adaptation["adaptation"]["output"],
        "phase c export": adapted["export"],
        "evaluation report": report["files"].get("report_md") if report else None,
        "evaluation gallery": report["files"].get("gallery_html") if report else None,
        "evaluation games": str(Path(report["out"]) / "games") if report else None,
        "5-turn game": story,
    }
    for name, value in summary.items():
        if value is not None:  # what this recipe has no stage for (a VAE, a decoder base) goes unsaid
            log.info("%-26s %s", name, value)
    return summary
