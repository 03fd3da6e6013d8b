"""The whole recipe as one call: pipeline -> [VAE] -> pre-flight -> phase (a1, a2) -> representations -> session
shards -> phase (b) -> adaptation shards -> phase (c) -> evaluation (benchmark games, metrics, report).
The quick start and fine-tuning on a new film are two parameterisations of it, and the Table 3 recipe
(:mod:`animegamer.ablations`) runs its phase (a) stages; every stage is the same code path as its own
command.

Before any stage, :func:`check_stages` checks every stage's settings, the export it starts from and the
pipeline's inputs and caption import, and refuses with all their problems at once. After the pipeline
and before the first training step, :func:`check_recipe` checks that the data
allows every stage (captioned clips, training sessions, held-out shots), so a run that cannot finish
fails in seconds with what to change.

With ``Recipe.vae`` set, the pipeline stops after its clip steps, the preset's frozen VAE is trained on
the training clips (:func:`animegamer.toy_vae.ensure_trained`, reused when already trained from the same
clips and settings) into ``Recipe.vae_out``, and every later stage, precompute included, loads it
(``model.encoders.vae.path``): random frozen VAEs give no pixels back, so pixel metrics need it. With
``Recipe.vae_out`` alone, it names a VAE trained elsewhere (by :mod:`animegamer.toy_vae`, e.g. in stages):
after the clip steps the folder is checked (:func:`trained_vae`: the preset's VAE config, trained on these
clips) and every later stage loads it as it is.

With ``Recipe.decoder_base`` set, after the pipeline (the stage trains on phase (a)'s samples) the whole
plain decoder is pre-trained (phase ``a_base``, :data:`BASE_OVERRIDES`), the stand-in of CogVideoX's
pre-training for presets without its weights, and every later stage loads its export's transformer
folder as ``model.decoder.path``: phases (a) and (c) train adapters over a frozen base, and a random one
gives noise. Phase (a1) still starts from a fresh encoder; the base stage's is discarded.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Sequence

from omegaconf import OmegaConf

from animegamer.checkpoints.export import EXPORT_FILE
from animegamer.checkpoints.trained_data import clip_manifest, clip_size_of, trained_clip_size
from animegamer.config.compose import (carried_over, command_body, compose_config, override_key, overrides_for,
                                       path_override, quoted)
from animegamer.config.disk_checks import read_json_object
from animegamer.config.schema import INIT_FROM_KEY
from animegamer.config.validate import (PIPELINE_DEVICES, ConfigError, check_gpu_available, check_pipeline_devices,
                                       device_problems)
from animegamer.contracts.exports import TRAIN_SECONDS
from animegamer.contracts.files import CLIPS_DIR, GAME_PAGE_FILE, LOSS_HISTORY
from animegamer.contracts.steps import CLIP_STEPS
from animegamer.data.split_checks import (captions_problems, counts_of, held_out_problems, options_of,
                                         session_problems, split_suggestion, training_problems, validation_gap)
from animegamer.data.split_counts import SplitCounts
from animegamer.data.trained_data import clip_content_sha256
from animegamer.errors import InvalidInputError, stop_if_interrupted
from animegamer.evaluation.preflight import check_evaluation
from animegamer.evaluation.reuse import evaluate_or_reuse, evaluation_fingerprint
from animegamer.evaluation.runner import story_instructions
from animegamer.game.models import load_game_models, read_level_flow
from animegamer.game.scheduler import play_game
from animegamer.game.writer import GAME_FILE
from animegamer.media.fingerprint import fingerprint
from animegamer.models.decoder import BASE_FOLDER
from animegamer.phases.preflight import check_training
from animegamer.pipeline_port import load_pipeline
from animegamer.toy_vae import TRAINING_RECORD, ToyVAETraining, ensure_trained, init_link
from animegamer.training.run_record import RunFolderChanged, only_data_changed
from animegamer.utils.folder_lock import LOCK_FILE, folder_lock
from animegamer.utils.io import first_free, read_json, write_json_atomic

log = logging.getLogger(__name__)


# A stage's training, in this process (what train.py runs after its checks): loaded when the first stage
# trains, so a recipe refused by its checks never loads Lightning.
train_run = command_body("animegamer.phases.run", "run")


@dataclass
class Recipe:
    pipeline: list[str]  # overrides of the pipeline root (e.g. an experiment and the inputs)
    phase_a: list[str]  # overrides of the train root for both phase (a) stages
    phase_b: list[str]
    phase_c: list[str]
    evaluation: list[str] = field(default_factory=list)  # overrides of the evaluate root; empty = no evaluation
    start_a: str = ""  # an earlier phase (a) export: skip the warm-up, start a_joint from it
    start_b: str = ""  # an earlier phase (b) export to start from
    # Overrides for every stage: each stage takes those its command reads (config.compose.overrides_for).
    extra: list[str] = field(default_factory=list)
    vae: ToyVAETraining | None = None  # train the frozen VAE after the clips (None: the config's VAE)
    vae_out: str = ""  # its folder (diffusers format); with vae set, required; without, a folder trained elsewhere
    # Overrides of train.py for the decoder base stage (phase a_base); None: the config's decoder.
    decoder_base: list[str] | None = None
    # What a stage's refusal to resume names as the way to train into a new folder: the command's own option.
    new_folder: str = ""  # empty: RECIPE_NEW_FOLDER


STORY_TURNS = 5
# The summary's name of the demonstration game: up to STORY_TURNS turns, as many as the film's longest run of
# captioned clips holds.
STORY = "demonstration game"
# The demonstration game's record, written once it is played: the fingerprint it was played with and its result.
STORY_RECORD = "story_record.json"
# A recipe's stages each train into ``output_dir`` (``${phase.name}`` below it); a plain folder would put every
# stage into one, where the next stage is refused.
RECIPE_NEW_FOLDER = "'output_dir=NEW_FOLDER/${phase.name}'"
OUT_NEW_FOLDER = "--out NEW_FOLDER"  # the same, for a command whose --out option holds every stage's folder
ROOTS = ("train", "pipeline", "evaluate")  # the roots a recipe's stages compose, in the order of check_stages
# The pipeline steps that read a stage's export: the recipe runs them after that stage, never in its first call.
LATER_STEPS = ("representations", "session_shards", "adaptation")
# What the base stage adds to its overrides: the base is a plain video diffusion transformer.
BASE_OVERRIDES = ("phase=a_base", "model.decoder.motion_scope=false")
BASE_MOTION_SCOPE = BASE_OVERRIDES[1].split("=")[0]
# Steps averaged for the base stage's final training loss (one step's is noisy: each draws its own timesteps).
FINAL_LOSS_STEPS = 20
# What the summary says for a validation metric the stage did not measure in this launch, with why.
NOT_VALIDATED = "not measured in this launch: {reason}"
FINISHED_EARLIER = "the stage finished in an earlier launch (that launch's log has its validation)"
# What a played-nothing evaluation says (a model trained too briefly writes states outside the layout).
NO_TURN_PLAYED = ("evaluation: no turn of {planned} was played: every state generation was malformed (the log names "
                  "each); train phase (b) longer, or decode the states within the layout with "
                  "model.mllm.constrained_states=true (finetune --constrained-states)")
SUPERSEDED = ".superseded-"
# The evaluate root's nodes that the train root has too, with the same meaning (config/schema.py).
SHARED_WITH_TRAINING = ("model", "pipeline", "data", "seed")  # a stage's earlier run, set aside when it must start afresh: <folder>.superseded-N


def out_overrides(out: str | Path) -> list[str]:
    """A command's ``--out`` folder as its stages' overrides: the pipeline's output in ``out/pipeline``, each
    training stage in ``out/<phase>``, both quoted (:func:`animegamer.config.compose.path_override`), so any
    folder name reaches them as it is; the evaluation and the demonstration game follow the stages."""
    return [path_override("pipeline.output", Path(out) / "pipeline"),
            "output_dir=" + quoted(str(out), raw_suffix="/${phase.name}")]


def stage_overrides(root: str, overrides: list[str]) -> list[str]:
    """What of ``overrides`` (given for every stage) the stages over the root ``root`` take."""
    return overrides_for(root, overrides, ROOTS)


def run_pipeline_step(overrides: list[str]) -> dict:
    """``python -m data_pipeline <overrides>``, through the installed pipeline."""
    return load_pipeline().run(overrides)


def train_stage(overrides: list[str], new_folder: str = "") -> dict:
    """``train.py <overrides>``: validated, then trained (resumed, or skipped when already done).

    A stage whose folder holds checkpoints trained on other shards (an earlier stage trained again, and
    the shards made from its export with it) starts afresh, since what it trained on is gone; the earlier
    run is kept beside it (:func:`supersede`), never deleted. A changed setting that alters the training
    still stops the stage, as it stops ``train.py``, with the two ways on; ``new_folder`` is how the
    command that runs the stage trains into another folder (empty: ``train.py``'s ``output_dir``)."""
    stop_if_interrupted()  # a Ctrl-C swallowed in the stage before stops the recipe here
    composed = compose_config("train", overrides)
    try:
        return train_run(composed)
    except RunFolderChanged as changed:
        if not only_data_changed(changed):
            raise (changed.advising(new_folder) if new_folder else changed) from None
        kept = supersede(Path(composed.output_dir), composed.lock_wait_seconds)
        log.warning("%s: the shards it trained on changed since its checkpoints (%s); the stage starts afresh, its "
                    "earlier run is kept in %s", composed.output_dir,
                    ", ".join(change.key for change, _ in changed.refusals), kept)
        return train_run(composed)


def supersede(folder: Path, wait_seconds: float) -> Path:
    """Move what ``folder`` holds into the first free ``<folder>.superseded-N`` and return that path. The
    folder's lock is held meanwhile (the lock file itself stays), so no run starts in it half-moved."""
    with folder_lock(folder, wait_seconds):
        kept = first_free(lambda n: folder.with_name(f"{folder.name}{SUPERSEDED}{n}"))
        kept.mkdir()
        for entry in folder.iterdir():
            if entry.name != LOCK_FILE:
                entry.rename(kept / entry.name)
    return kept


def evaluation_config(overrides: list[str]):
    return compose_config("evaluate", overrides)


def evaluation_of(trained, overrides: list[str]):
    """The evaluation config of a model trained with the train config ``trained``: the settings both commands
    read (the networks, the data and the pipeline settings it was made with, the seed) as ``trained`` has
    them, the evaluation's own from ``overrides`` (the evaluate root's)."""
    return carried_over("evaluate", trained, overrides)


def start_clip_size_problems(phase_a, start: str) -> list[str]:
    """Training from an earlier export continues at the clip size it was trained at."""
    trained, configured = trained_clip_size(start), clip_size_of(phase_a.pipeline.clips)
    if trained is not None and trained != configured:
        return [f"{start} was trained on clips of {trained}, but this run cuts {configured}: "
                f"leave pipeline.clips at the trained size ({' '.join(trained.overrides())})"]
    return []


def base_stage_problems(overrides: Sequence[str]) -> list[str]:
    """The base stage's own overrides asking for what :data:`BASE_OVERRIDES` sets otherwise: the base is a
    plain video diffusion transformer whatever they say, so such an override would be silently lost."""
    asked = [o for o in overrides if override_key(o) == BASE_MOTION_SCOPE]
    if asked and compose_config("train", [*overrides, BASE_OVERRIDES[0]]).model.decoder.motion_scope:
        return [f"decoder base: {asked[-1]} cannot apply: the base stage trains a plain video diffusion transformer "
                f"({BASE_OVERRIDES[1]}); phases a1 and a2 add the motion scope over it"]
    return []


def stage_configs(recipe: Recipe) -> list:
    """Each training stage's composed config, in the order they train. Each starts from the export the recipe
    gives it: checked where it exists now (the recipe's starts), left out where an earlier stage trains it."""
    extra = stage_overrides("train", recipe.extra)
    made_later = f"{INIT_FROM_KEY}=''"
    start_b = [path_override(INIT_FROM_KEY, recipe.start_b)] if recipe.start_b else []
    start_a = path_override(INIT_FROM_KEY, recipe.start_a) if recipe.start_a else made_later
    stages = [compose_config("train", [*recipe.phase_a, "phase=a_joint", start_a, *extra]),
              compose_config("train", [*recipe.phase_b, *start_b, *extra]),
              compose_config("train", [*recipe.phase_c, made_later, *extra])]
    if not recipe.start_a:
        stages.insert(0, compose_config("train", [*recipe.phase_a, "phase=a_warmup", *extra]))
    if recipe.decoder_base is not None:
        stages.insert(0, compose_config("train", [*recipe.decoder_base, *extra, *BASE_OVERRIDES]))
    return stages


def by_stage(problems_of: Callable, stages: list) -> list[str]:
    """``problems_of(stage)`` over the stages, each problem named once with the stages that have it (a setting
    they share: all of them)."""
    found: dict[str, list[str]] = {}
    for stage in stages:
        for problem in problems_of(stage):
            found.setdefault(problem, []).append(str(stage.phase.name))
    return [f"phase {', '.join(names)}: {problem}" for problem, names in found.items()]


def machine_problems(recipe: Recipe, stages: list | None = None, vae_device: str = "Recipe.vae.device") -> list[str]:
    """What this machine lacks for the recipe: a CUDA GPU that a stage's trainer, a pipeline step or the VAE
    stage asks for (``stages``: :func:`stage_configs`, composed by the caller; ``vae_device``: how the caller's
    user sets the VAE stage's device). Checked before anything is drawn or trained: each would stop only once
    it reached its stage."""
    stages = stage_configs(recipe) if stages is None else stages
    problems = by_stage(lambda stage: check_gpu_available(stage.trainer), stages)
    pipeline = compose_config("pipeline", [*recipe.pipeline, *stage_overrides("pipeline", recipe.extra)]).pipeline
    problems += check_pipeline_devices(pipeline, PIPELINE_DEVICES)
    if recipe.vae is not None:
        problems += device_problems(recipe.vae.device, f"{vae_device} {recipe.vae.device}", f"{vae_device} cpu")
    return problems


def check_stages(recipe: Recipe, first_steps: str) -> None:
    """The recipe's pre-flight before its first stage, every problem in one :class:`ConfigError`: the clip
    size ``start_a`` was trained at, each training stage's and the evaluation's settings (a problem of
    several stages named once, with them), what this machine lacks for them (:func:`machine_problems`), the
    first pipeline call's (``first_steps``) settings and, where anything is refused, its films and caption
    import. What a stage reads from the pipeline's output or from an earlier stage's export is made later:
    the pipeline's own pre-flight, :func:`check_recipe` and each stage's validation check it in its turn."""
    pipeline_extra, evaluation_extra = (stage_overrides(root, recipe.extra) for root in ROOTS[1:])
    stages = stage_configs(recipe)
    problems = base_stage_problems(recipe.decoder_base) if recipe.decoder_base is not None else []
    if recipe.start_a:
        joint = next(stage for stage in stages if stage.phase.name == "a_joint")
        problems += start_clip_size_problems(joint, recipe.start_a)
    problems += by_stage(lambda stage: check_training(stage, data=False), stages)
    problems += machine_problems(recipe, stages)
    if recipe.evaluation:
        evaluated = evaluation_config([*recipe.evaluation, *evaluation_extra])
        problems += [f"evaluation: {problem}" for problem in check_evaluation(evaluated, made=False)]
    load_pipeline().check(compose_config("pipeline", [*recipe.pipeline, first_steps, *pipeline_extra]), problems)


def say_if_nothing_played(metrics: dict) -> bool:
    """Log an error when the evaluation planned turns and played none (its report alone would only show
    empty tables); returns whether it did."""
    played = metrics.get("games", {})
    if played.get("planned_turns") and not played.get("completed_turns"):
        log.error(NO_TURN_PLAYED.format(planned=played["planned_turns"]))
        return True
    return False


def played_nothing(summary: dict) -> list[str]:
    """What of a recipe's summary planned turns and played none: the evaluation, the demonstration game."""
    empty = []
    for what, played, planned in (("the evaluation", "evaluation turns played", "evaluation turns planned"),
                                  ("the demonstration game", f"{STORY} turns played", f"{STORY} turns planned")):
        if summary.get(planned) and not summary.get(played):
            empty.append(f"{what} (0 of {summary[planned]} turns)")
    return empty


def play_story(composed, out: Path) -> dict:
    """A demonstration game: the trained game plays the instructions of consecutive clips of the film;
    returns its page (with why it stopped when it did before its last turn), its turns played and planned."""
    cfg = OmegaConf.to_object(composed)
    e = cfg.evaluation
    models = load_game_models(cfg, e.mllm_export, e.renderer_export,
                              read_level_flow(clip_manifest(cfg.data.root, cfg.data.clips)))
    script = story_instructions(cfg, STORY_TURNS)
    try:
        record = play_game(models, script, out, seed=cfg.seed, overwrite=True)
    except ValueError as error:  # a malformed state generation ends the game; game.json records it
        log.warning("the demonstration game stopped: %s", error)
        return {"page": f"{out / GAME_PAGE_FILE} (stopped early: {error})", "played": len(story_turns(out)),
                "planned": len(script)}
    return {"page": str(out / GAME_PAGE_FILE), "played": len(record["turns"]), "planned": len(script)}


def story_turns(out: Path) -> list[dict]:
    """The turns game.json in ``out`` records (none without a readable one)."""
    turns = (read_json_object(out / GAME_FILE) or {}).get("turns")
    return [t for t in turns if isinstance(t, dict)] if isinstance(turns, list) else []


def reused_story(out: Path, fp: str) -> dict | None:
    """The demonstration game in ``out`` when it was played to its end with fingerprint ``fp`` and every
    file of it is in place (None: play it; an unreadable record too)."""
    record = read_json_object(out / STORY_RECORD) or {}
    story = record.get("story") if record.get("fingerprint") == fp else None
    if not isinstance(story, dict) or not (out / GAME_PAGE_FILE).is_file():
        return None
    turns = story_turns(out)
    if len(turns) != story.get("played") or not all((out / str(t.get("video"))).is_file() for t in turns):
        return None
    return story


def story_or_reuse(composed, out: Path) -> dict:
    """:func:`play_story`'s result: read back when the game was played with the same config, exports and
    clips as the evaluation's (its fingerprint, :mod:`animegamer.evaluation.reuse`), else played and
    recorded. A change of code is not seen: delete the folder to play it again."""
    fp = fingerprint(evaluation_fingerprint(composed), STORY_TURNS)
    story = reused_story(out, fp)
    if story is not None:
        log.info("demonstration game: reused %s (same config, exports and clips)", out)
        return story
    (out / STORY_RECORD).unlink(missing_ok=True)  # a game cut short must not leave the old record valid
    story = play_story(composed, out)
    write_json_atomic(out / STORY_RECORD, {"fingerprint": fp, "story": story})
    return story


def preset_vae(recipe: Recipe, whose: str):
    """Phase (a2)'s train config and its ``model.encoders.vae``: the preset's VAE, which ``whose`` (the
    recipe's own VAE, trained here or elsewhere) replaces, so its path must be empty."""
    cfg = compose_config("train", [*recipe.phase_a, "phase=a_joint", *stage_overrides("train", recipe.extra)])
    vae_cfg = OmegaConf.to_object(cfg.model.encoders.vae)
    if vae_cfg.path:
        raise ConfigError([f"{whose} is the VAE of every stage, but model.encoders.vae.path names one too "
                           f"({vae_cfg.path!r}): leave the path empty"])
    return cfg, vae_cfg


def trained_vae(recipe: Recipe, name: str, clips: bool = False) -> dict:
    """The record of ``Recipe.vae_out``, a VAE folder trained elsewhere by :mod:`animegamer.toy_vae`, once
    checked: a trained folder of the preset's VAE config holding the weights its record names
    (:func:`animegamer.toy_vae.init_link`) and, with ``clips`` (once the pipeline has cut them), trained on
    this run's clips (their content digest). A refusal is a user error naming the folder after ``name`` (how
    the command names it)."""
    cfg, vae_cfg = preset_vae(recipe, f"{name} {recipe.vae_out}")
    init_link(recipe.vae_out, vae_cfg, option=name)
    record = read_json(Path(recipe.vae_out) / TRAINING_RECORD)
    if clips:
        folder = Path(cfg.data.root) / CLIPS_DIR
        here, trained_on = clip_content_sha256(cfg.data.root, CLIPS_DIR), record.get("clip_content_sha256")
        if here is None or trained_on != here:
            raise InvalidInputError(f"{name} {recipe.vae_out}: trained on other clips (clip content sha256 "
                                    f"{trained_on}) than this run's ({here}, {folder})")
    return record


def clip_steps(recipe: Recipe) -> None:
    """The pipeline's clip steps alone: what a VAE stage needs before the features are made with it."""
    run_pipeline_step([*recipe.pipeline, f"pipeline.steps=[{','.join(CLIP_STEPS)}]",
                       *stage_overrides("pipeline", recipe.extra)])


def trained_vae_stage(recipe: Recipe) -> dict:
    """The pipeline's clip steps, then the VAE folder ``Recipe.vae_out`` trained elsewhere checked against
    them (:func:`trained_vae`); returns its record."""
    clip_steps(recipe)
    return trained_vae(recipe, "VAE folder", clips=True)


def train_vae_stage(recipe: Recipe) -> dict:
    """The pipeline's clip steps, then the preset's VAE trained on their training clips (or reused)."""
    if not recipe.vae_out:
        raise ValueError("Recipe.vae is set but Recipe.vae_out is empty: name the folder the VAE is written to")
    clip_steps(recipe)
    cfg, vae_cfg = preset_vae(recipe, "Recipe.vae (the VAE trained on the clips)")
    settings = replace(recipe.vae, val_fraction=float(cfg.data.val_fraction))  # never a held-out shot
    return ensure_trained(recipe.vae_out, cfg.data.root, vae_cfg, int(cfg.model.encoders.seed), settings,
                          {"model": str(cfg.model.name)})


def step_losses(run_folder: str | Path) -> list[tuple[int, float]]:
    """A run's per-step training loss (its micro-batches averaged), from its loss history."""
    by_step: dict[int, list[float]] = {}
    for step, _, loss in json.loads((Path(run_folder) / LOSS_HISTORY).read_text()):
        by_step.setdefault(int(step), []).append(float(loss))
    return sorted((step, sum(v) / len(v)) for step, v in by_step.items())


def trained_seconds(export: str | Path) -> float | None:
    """How long the run of ``export`` trained, over all its launches (None: an export from before that
    was recorded)."""
    return (read_json_object(Path(export) / EXPORT_FILE) or {}).get(TRAIN_SECONDS)


def train_base_stage(overrides: list[str], extra: list[str], new_folder: str = "") -> dict:
    """The decoder base (phase a_base), trained or, when its run finished already, reused; returns its
    run (``export``) and the diffusers folder later stages load (``folder``), its final training loss
    and the seconds it took here; ``extra``: overrides for every stage (those of the train root are taken)."""
    stage = [*overrides, *stage_overrides("train", extra), *BASE_OVERRIDES]
    path = compose_config("train", stage).model.decoder.path
    if path:
        raise ValueError(f"Recipe.decoder_base is set but model.decoder.path is too ({path!r}): the base stage "
                         f"pre-trains a random build of the preset's sizes; leave the path empty")
    run = train_stage(stage, new_folder)
    losses = [loss for _, loss in step_losses(Path(run["export"]).parent)[-FINAL_LOSS_STEPS:]]
    return {"export": run["export"], "folder": str((Path(run["export"]) / BASE_FOLDER).resolve()),
            "train_loss": sum(losses) / len(losses), "seconds": trained_seconds(run["export"])}


def first_pipeline_steps(overrides: list[str]) -> list[str]:
    """The steps of the recipe's first pipeline call: those the pipeline would run with ``overrides``, less
    :data:`LATER_STEPS` (by default it would rebuild session shards over earlier representations, or warn
    that they are stale, just before the recipe makes them afresh)."""
    steps = load_pipeline().steps(compose_config("pipeline", overrides))
    return [step for step in steps if step not in LATER_STEPS]


def validation_result(result: dict, key: str, composed, counts, sessions: bool = False):
    """A stage's validation metric ``key`` of this launch, or why it has none: the stage finished in an
    earlier launch (no metric at all), else what :func:`animegamer.data.split_counts.validation_gap` finds in
    its config and the held-out data ``counts``."""
    if key in result["metrics"]:
        return result["metrics"][key]
    if not result["metrics"]:
        return NOT_VALIDATED.format(reason=FINISHED_EARLIER)
    return NOT_VALIDATED.format(reason=validation_gap(composed, counts, sessions) or "see the stage's log")


def raise_problems(problems: list[str]) -> None:
    unique = list(dict.fromkeys(problems))
    if unique:
        raise ConfigError(unique)


def check_recipe(phase_a, phase_b=None, evaluation=None, run: str = "") -> dict[str, SplitCounts]:
    """Everything the recipe's stages need from the pipeline output, before the first one trains.

    Each argument is that stage's composed config (None: the stage does not run); ``run`` names the run in
    the log lines, where one command checks several (the ablations' variants). Raises
    :class:`ConfigError` listing every problem; warns where a stage will run without validation."""
    who = f"{run}: " if run else ""
    counts = {"phase a": counts_of(phase_a)}
    c = counts["phase a"]
    problems = captions_problems(c)
    split = training_problems(c, "phase a")  # what the held-out fraction or the session length would fix
    if c.captioned and (gap := validation_gap(phase_a, c)):
        log.warning("%sphase a: %s: validation is skipped", who, gap)
    b = None
    if phase_b is not None:
        counts["phase b"] = b = counts_of(phase_b)
        split += training_problems(b, "phase b") + session_problems(b)
        if b.train_sessions and (gap := validation_gap(phase_b, b, sessions=True)):
            log.warning("%sphase b: %s: validation is skipped", who, gap)
    if evaluation is not None:
        counts["evaluation"] = e = counts_of(evaluation)
        problems += captions_problems(e)
        split += held_out_problems(e, "evaluation", trained=False)
    problems += split
    if split:  # each stage's own fix can undo another's: one value for the whole run, where there is one
        suggestion = split_suggestion(b or c, options_of(phase_b if b is not None else phase_a),
                                      b.turns if b is not None else None)
        if suggestion:
            problems.append(f"for all of the above at once: {suggestion}")
    raise_problems(problems)
    for stage, n in counts.items():
        log.info("%spre-flight %s: %d clips, %d captioned in %d shot(s); %d to train on, %d held out; %d training "
                 "and %d held-out session(s)", who, stage, n.clips, n.captioned, len(n.shots), n.train_clips,
                 n.held_out_clips, n.train_sessions, n.held_out_sessions)
    return counts


def run_recipe(recipe: Recipe) -> dict:

    first = first_pipeline_steps([*recipe.pipeline, *stage_overrides("pipeline", recipe.extra)])
    first_steps = f"pipeline.steps=[{','.join(first)}]"
    check_stages(recipe, first_steps)
    vae_record = None
    if recipe.vae is not None:
        vae_record = train_vae_stage(recipe)
    elif recipe.vae_out:
        vae_record = trained_vae_stage(recipe)
    if recipe.vae_out:
        vae = path_override("model.encoders.vae.path", Path(recipe.vae_out).resolve())
        recipe = replace(recipe, extra=[*recipe.extra, vae])
    extra = list(recipe.extra)  # read at each call below: the base stage appends the decoder's path
    new_folder = recipe.new_folder or RECIPE_NEW_FOLDER
    pipe = lambda *o: run_pipeline_step([*recipe.pipeline, *o, *stage_overrides("pipeline", extra)])
    train = lambda stage, *o: train_stage([*stage, *o, *stage_overrides("train", extra)], new_folder)
    start_a = recipe.start_a
    clips = pipe(first_steps)
    phase_a = compose_config("train", [*recipe.phase_a, "phase=a_joint", *stage_overrides("train", extra)])
    phase_b = compose_config("train", [*recipe.phase_b, *stage_overrides("train", extra)])
    evaluated = None
    if recipe.evaluation:
        evaluated = evaluation_config([*recipe.evaluation, *stage_overrides("evaluate", extra)])
    counts = check_recipe(phase_a, phase_b, evaluated)
    base = None
    if recipe.decoder_base is not None:
        base = train_base_stage(recipe.decoder_base, extra, new_folder)
        extra.append(path_override("model.decoder.path", base["folder"]))
    if not start_a:
        start_a = train(recipe.phase_a, "phase=a_warmup")["export"]
    joint = train(recipe.phase_a, "phase=a_joint", path_override(INIT_FROM_KEY, start_a))
    reps = pipe("pipeline.steps=[representations,session_shards]",
                path_override("pipeline.representations.export", joint["export"]))
    game = train(recipe.phase_b, *([path_override(INIT_FROM_KEY, recipe.start_b)] if recipe.start_b else []))
    adaptation = pipe("pipeline.steps=[adaptation]", path_override("pipeline.adaptation.export", game["export"]))
    adapted = train(recipe.phase_c, path_override(INIT_FROM_KEY, joint["export"]))
    report, story = None, None
    if recipe.evaluation:
        root = Path(adapted["export"]).parent.parent
        evaluation = evaluation_config([
            *recipe.evaluation, path_override("evaluation.mllm_export", game["export"]),
            path_override("evaluation.renderer_export", adapted["export"]),
            path_override("evaluation.reconstruction_export", joint["export"]),
            *stage_overrides("evaluate", extra), path_override("evaluation.out", root / "eval")])
        report = evaluate_or_reuse(evaluation)
        say_if_nothing_played(report["metrics"])
        story = story_or_reuse(evaluation, root / "game")
    played = (report or {}).get("metrics", {}).get("games", {})
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
        "phase a2 val/loss": validation_result(joint, "val/loss", phase_a, counts["phase a"]),
        "representations": reps["representations"]["output"],
        "session shards": reps["session_shards"]["output"],
        "phase b export": game["export"],
        "phase b val/state_accuracy": validation_result(game, "val/state_accuracy", phase_b, counts["phase b"],
                                                        sessions=True),
        "adaptation shards": adaptation["adaptation"]["output"],
        "phase c export": adapted["export"],
        "evaluation report": report["files"].get("report_md") if report else None,
        "evaluation gallery": report["files"].get("gallery_html") if report else None,
        "evaluation games": str(Path(report["out"]) / "games") if report else None,
        "evaluation turns planned": played.get("planned_turns"),
        "evaluation turns played": played.get("completed_turns"),
        STORY: story["page"] if story else None,
        f"{STORY} turns planned": story["planned"] if story else None,
        f"{STORY} turns played": story["played"] if story else None,
    }
    for name, value in summary.items():
        if value is not None:  # what this recipe has no stage for (a VAE, a decoder base) goes unsaid
            log.info("%-26s %s", name, value)
    return summary
