"""``evaluate.py``'s body: benchmark games from held-out sessions, played and scored.

A benchmark game is consecutive turns of one held-out session: each turn's instruction, environment
text, ground-truth first frame (by clip key), motion level and states. The trained game plays the
instructions; the generated clips and predicted states are scored against the truth with the
paper's Table 1 metrics and PSNR against each turn's held-out clip; baselines (majority-class and
copy-the-last-turn states, optionally the untrained game) are scored beside it on the same turns.
Model-based metrics without local weights are reported unavailable.
"""
from __future__ import annotations

import json
import logging
import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch
from omegaconf import OmegaConf
from tqdm import tqdm

from animegamer.checkpoints.export import recorded_start
from animegamer.checkpoints.trained_data import clip_manifest
from animegamer.config.schema import PhaseAConfig, RunConfig
from animegamer.contracts.files import METRICS_FILE
from animegamer.contracts.states import MOTION_LEVEL
from animegamer.data.indexed import IndexedShardDataset
from animegamer.data.phase_a import FEATURES, phase_a_dataset
from animegamer.data.split import consecutive_runs, held_out
from animegamer.diffusion.step_cache import caching
from animegamer.evaluation.benchmark import benchmark_problems, read_benchmark, refuse
from animegamer.evaluation.judge import judge_report_games
from animegamer.evaluation.motion_sweep import LATENT_PERSISTENCE, LATENT_SHIFT, PIXEL_FLOW, PIXEL_PERSISTENCE, \
    SWEEP_KEY, headline, sweep, with_truth
from animegamer.evaluation.preflight import validate_eval_run
from animegamer.evaluation.record import forget_record
from animegamer.evaluation.report import PAPER_TABLE3_RECONSTRUCTION, write_report
from animegamer.game.models import default_device, load_game_mllm, load_game_models, play_dtype, read_level_flow, \
    renderer_for_play
from animegamer.game.scheduler import play_games
from animegamer.media.captions import STATUS_OK
from animegamer.metrics.baselines import SHUFFLED, UNTRAINED, derangement, state_baselines
from animegamer.metrics.clip_scores import try_load_clip
from animegamer.metrics.common import available, mean_metric, unavailable
from animegamer.metrics.detail_persistence import frame_persistence, latent_persistence
from animegamer.metrics.dreamsim import dreamsim_score, try_load_dreamsim
from animegamer.metrics.latent_motion import clip_speed, latent_motion
from animegamer.metrics.motion import make_estimator, measure_levels, motion_accuracy
from animegamer.metrics.psnr import clip_psnr
from animegamer.metrics.setup import describe_setup
from animegamer.metrics.states import state_accuracy
from animegamer.models.frozen_encoders import build_frozen_encoders
from animegamer.models.reconstruction import ClipBatch, build_reconstruction
from animegamer.utils.io import first_free, write_bytes_atomic
from animegamer.utils.logging import setup_logging
from animegamer.utils.randomness import step_generator
from animegamer.utils.text import count_of, join_words
from animegamer.utils.threads import use_threads

log = logging.getLogger(__name__)

BENCHMARK_FILE = "benchmark.json"
RECONSTRUCTION_FOLDER = "reconstruction"
TRUTH_FOLDER = "truth"  # the held-out clips the benchmark games stand for, beside the generated ones
UNTRAINED_FOLDER = "untrained"  # the untrained-game baseline's games (evaluation.untrained_game)
RECONSTRUCTION_KEYS = ("clip_i", "dreamsim", "psnr")  # per-clip scores of the reconstruction and its baseline
# The reconstruction's ceiling: each held-out clip's own VAE latents decoded, with no decoder at all. Its
# PSNR and ACC-F bound every renderer's, and show what the VAE itself loses (e.g. fast motion).
VAE_ROUND_TRIP = "vae_round_trip"
VAE_ROUND_TRIP_LABEL = "VAE round trip (the clip's own latents decoded: every renderer's ceiling)"
STAGES = ("mllm", "sample", "vae_decode", "total")
GAMES_FOLDER = "games"  # each benchmark game plays into games/<id> under evaluation.out


def held_out_games(cfg: RunConfig) -> dict:
    """Games made of held-out shots (no phase trained on any of their clips): runs of consecutive
    held-out, captioned clips of one film, cut into games of up to ``evaluation.turns`` turns."""
    clips = IndexedShardDataset(Path(cfg.data.root) / cfg.data.clips, lambda s: s["json"], video=False)
    split = held_out(cfg)
    keep = lambda meta: split.clip(meta["key"]) and meta["captioner"]["status"] == STATUS_OK
    turns = cfg.evaluation.turns
    games = []
    for run in consecutive_runs((clips[i] for i in range(len(clips))), keep):
        for start in range(0, len(run), turns):
            chunk = run[start : start + turns]
            games.append({"id": chunk[0]["key"], "turns": [
                {"key": m["key"], "instruction": m["instruction"], "environment": m["caption"]["environment"],
                 "level": m["motion"]["level"], "states": {MOTION_LEVEL: m["motion"]["level"], **m["states"]}}
                for m in chunk]})
    games = sorted(games, key=lambda g: -len(g["turns"]))[: cfg.evaluation.games]  # longest games first
    if not games:
        raise ValueError(f"{clips.locations[0].shard}: no held-out shot (data.val_fraction={cfg.data.val_fraction}); "
                         "evaluate exports trained with a larger data.val_fraction (at that fraction), another "
                         "pipeline output, or pass evaluation.benchmark")
    played = [len(game["turns"]) for game in games]
    if len(games) < cfg.evaluation.games or min(played) < turns:
        lengths = count_of(played[0], "turn") if len(played) == 1 else f"{join_words([str(n) for n in played])} turns"
        log.warning("evaluation: %s of %s where evaluation.games=%d and evaluation.turns=%d ask for "
                    "more: a game is a run of consecutive held-out, captioned clips of one film, and the held-out "
                    "shots (data.val_fraction=%s) give no more", count_of(len(games), "game"), lengths,
                    cfg.evaluation.games, turns, cfg.data.val_fraction)
    return {"source": str(Path(cfg.data.root) / cfg.data.clips), "held_out": "shots", "games": games}


def clip_metas(cfg: RunConfig, keys: set[str] | None = None) -> list[dict]:
    """The json of every clip of the data's clip shards (only ``keys``' when given), in shard order."""
    clips = IndexedShardDataset(Path(cfg.data.root) / cfg.data.clips, lambda s: s["json"],
                                None if keys is None else (lambda key: key in keys), video=False)
    return [clips[i] for i in range(len(clips))]


def training_states(cfg: RunConfig) -> list[dict]:
    """The states (ML and the MLLM's states) of every captioned clip of no held-out shot: what the
    majority-class baseline counts, so that it never sees the benchmark's answers."""
    split = held_out(cfg)
    return [{MOTION_LEVEL: m["motion"]["level"], **m["states"]} for m in clip_metas(cfg)
            if not split.clip(m["key"]) and m["captioner"]["status"] == STATUS_OK]


def story_instructions(cfg: RunConfig, turns: int) -> list[str]:
    """The instructions of ``turns`` consecutive captioned clips of a film (the longest run first):
    a script for a demonstration game."""
    runs = consecutive_runs(clip_metas(cfg), lambda m: m["captioner"]["status"] == STATUS_OK)
    longest = max(runs, key=len) if runs else []
    return [m["instruction"] for m in longest[:turns]]


def benchmark_keys(benchmark: dict) -> set[str]:
    """The clip keys of a benchmark's turns (a hand-written benchmark's turns may have none)."""
    return {turn["key"] for game in benchmark["games"] for turn in game["turns"] if "key" in turn}


def write_truth_clips(cfg: RunConfig, keys: set[str], folder: Path) -> dict[str, Path]:
    """The benchmark's held-out clips, copied from the clip shards as ``folder/<key>.mp4`` (the gallery
    shows each beside the clip generated for it, and stays self-contained)."""
    clips = IndexedShardDataset(Path(cfg.data.root) / cfg.data.clips, lambda s: s["mp4"], lambda k: k in keys,
                                video=False, allow_empty=True)
    written = {}
    for index, key in enumerate(clips.keys()):
        written[key] = folder / f"{key}.mp4"
        write_bytes_atomic(written[key], clips[index])
    return written


def first_frames(cfg: RunConfig, keys: set[str]) -> dict[str, np.ndarray]:
    """Ground-truth first frames (H, W, 3) of the benchmark clips, decoded from the clip shards."""
    clips = IndexedShardDataset(Path(cfg.data.root) / cfg.data.clips, lambda s: s["mp4"][0], lambda k: k in keys)
    return {key: clips[i] for i, key in enumerate(clips.keys())}


def truth_clips(cfg: RunConfig, keys: set[str]) -> dict[str, np.ndarray]:
    """Ground-truth clips (T, H, W, 3) uint8 of ``keys``, decoded from the clip shards: what PSNR
    compares the generated and reconstructed clips with."""
    clips = IndexedShardDataset(Path(cfg.data.root) / cfg.data.clips, lambda s: s["mp4"], lambda k: k in keys,
                                allow_empty=True)
    return {key: clips[i] for i, key in enumerate(clips.keys())}


class Scorers:
    """The metric models, each loaded from local weights or explicitly unavailable."""

    def __init__(self, cfg: RunConfig) -> None:
        self.clip, self.clip_reason = try_load_clip(cfg.evaluation.clip_model)
        self.dreamsim, self.dreamsim_reason = try_load_dreamsim(cfg.evaluation.dreamsim)

    def turn(self, frames: np.ndarray, reference: np.ndarray, instruction: str, environment: str) -> dict:
        if self.clip is None:
            clip_i = clip_t = clip_t_env = unavailable(self.clip_reason)
        else:
            clip_i = available(self.clip.clip_i(frames, reference[None]))
            clip_t = available(self.clip.clip_t(frames, instruction))
            clip_t_env = available(self.clip.clip_t(frames, environment))
        dreamsim = dreamsim_score(self.dreamsim, frames, reference[None], self.dreamsim_reason)
        return {"clip_i": clip_i, "clip_t": clip_t, "clip_t_env": clip_t_env, "dreamsim": dreamsim}


def _earlier(path: Path) -> Path:
    """The first free ``<path>.earlier-N`` beside ``path``: where an earlier evaluation's output is kept."""
    return first_free(lambda n: path.with_name(f"{path.name}.earlier-{n}"))


def _set_aside_others(folder: Path, others: list[Path], what: str,
                      why: str = "of an earlier evaluation that this one does not play") -> Path | None:
    """Move ``others`` (entries of ``folder``) into ``<folder>.earlier-N``, kept; returns where (None: none)."""
    if not others:
        return None
    kept = _earlier(folder)
    kept.mkdir()
    for entry in others:
        entry.rename(kept / entry.name)
    log.warning("%s: %d %s %s moved to %s", folder, len(others), what, why, kept)
    return kept


def set_aside_earlier_report(out: Path) -> Path | None:
    """Move the report, gallery, plots and metrics of an earlier evaluation in ``out`` into ``<out>.earlier-N``,
    kept: the games they describe are played again in place, so a replay stopped halfway would leave pages
    linking to clips it has not written yet."""
    files = sorted(p for p in out.iterdir() if p.is_file()) if (out / METRICS_FILE).is_file() else []
    return _set_aside_others(out, files, "file(s)", "of an earlier evaluation, whose games this one plays again,")


def set_aside_other_games(games: Path, ids: set[str]) -> Path | None:
    """Move the game folders under ``games`` that this evaluation does not play (an earlier one into the same
    folder played more, or others) into ``<games>.earlier-N``, kept, so the folder holds only what its record
    names; returns where they went (None: nothing to move)."""
    others = sorted(p for p in games.iterdir() if p.is_dir() and p.name not in ids) if games.is_dir() else []
    return _set_aside_others(games, others, "game folder(s)")


def set_aside_other_truth(truth: Path, keys: set[str]) -> Path | None:
    """As :func:`set_aside_other_games` for the held-out clips in ``truth`` whose keys this evaluation's turns
    do not name."""
    others = sorted(p for p in truth.glob("*.mp4") if p.stem not in keys) if truth.is_dir() else []
    return _set_aside_others(truth, others, "held-out clip(s)")


def set_aside_folder(folder: Path) -> Path | None:
    """Move ``folder``, written by an earlier evaluation into the same output and not rewritten by this one, to
    ``<folder>.earlier-N`` beside it, kept; returns where it went (None: there was none)."""
    if not folder.exists():
        return None
    kept = _earlier(folder)
    folder.rename(kept)
    log.warning("%s: written by an earlier evaluation and not by this one; moved to %s", folder, kept)
    return kept


def set_aside_earlier_outputs(out: Path, benchmark: dict, untrained: bool, reconstruction: bool) -> list[Path]:
    """Before an evaluation plays ``benchmark`` into ``out``: what an earlier one wrote there and this one will
    not rewrite is moved beside it, kept, so that every game, clip and report in the folder is this
    evaluation's: the game folders of games ``benchmark`` does not name (the untrained game's too), the
    held-out clips its turns do not name, the untrained game's folder when ``untrained`` is off, the
    reconstruction's when ``reconstruction`` is, and its report, gallery, plots and metrics, which describe the
    games played again here. Returns where things went."""
    ids, keys = {game["id"] for game in benchmark["games"]}, benchmark_keys(benchmark)
    moved = [set_aside_earlier_report(out), set_aside_other_games(out / GAMES_FOLDER, ids),
             set_aside_other_truth(out / TRUTH_FOLDER, keys)]
    if untrained:
        moved += [set_aside_other_games(out / UNTRAINED_FOLDER / GAMES_FOLDER, ids),
                  set_aside_other_truth(out / UNTRAINED_FOLDER / TRUTH_FOLDER, keys)]
    else:
        moved.append(set_aside_folder(out / UNTRAINED_FOLDER))
    if not reconstruction:
        moved.append(set_aside_folder(out / RECONSTRUCTION_FOLDER))
    return [path for path in moved if path is not None]


def play_benchmark(cfg: RunConfig, models, benchmark: dict, out: Path, scorers: Scorers) -> tuple[list, list]:
    """Play every game; returns (report games, per-turn results). A malformed generation ends that game."""
    keys = benchmark_keys(benchmark)
    frames_by_key = first_frames(cfg, keys)
    truth_clips = write_truth_clips(cfg, keys, out / TRUTH_FOLDER)
    report_games, turns = [], []
    folders = [out / GAMES_FOLDER / game["id"] for game in benchmark["games"]]
    # evaluation.batch_games games advance together; each plays as it would alone.
    outcomes = play_games(models, [[t["instruction"] for t in game["turns"]] for game in benchmark["games"]], folders,
                          seed=cfg.seed, batch_games=cfg.evaluation.batch_games, overwrite=True,
                          sampling_steps=cfg.evaluation.sampling_steps)
    for game, folder, outcome in zip(benchmark["games"], folders, outcomes):
        played, stopped = outcome.results, None
        if outcome.error is not None:
            stopped = str(outcome.error)
            log.warning("game %s stopped: %s", game["id"], outcome.error)
        rows = []
        for truth, result in zip(game["turns"], played):
            scores = scorers.turn(result.frames, frames_by_key[truth["key"]], truth["instruction"], truth["environment"])
            turns.append({"truth": truth, "result": result, "scores": scores})
            rows.append({"instruction": truth["instruction"], "environment": truth["environment"],
                         "video": str(folder / f"turn_{result.index:03d}.mp4"), "states": result.predicted,
                         **({"truth_video": str(truth_clips[truth["key"]])} if truth.get("key") in truth_clips else {}),
                         "target_states": truth["states"],
                         "metrics": {**scores, "target_level": truth["level"]}})
        report_games.append({"id": game["id"], "turns": rows, "completed": len(played), "planned": len(game["turns"]),
                             **({"stopped": stopped} if stopped else {})})
    return report_games, turns


def aggregate(cfg: RunConfig, turns: list, bins: dict, truth: dict[str, np.ndarray]) -> dict:
    """The benchmark's metrics over the played ``turns``; ``truth``: the ground-truth clips by key (PSNR of
    each turn's clip against its turn's clip, unavailable for a benchmark turn without a key)."""
    metrics = {name: mean_metric([t["scores"][name] for t in turns], "no completed turn")
               for name in ("clip_i", "clip_t", "clip_t_env", "dreamsim")}
    psnr = [clip_psnr(t["result"].frames, truth.get(t["truth"].get("key"))) for t in turns]
    metrics["psnr"] = mean_metric(psnr, "no completed turn")
    metrics["psnr_per_turn"] = psnr
    if turns:
        motion = motion_accuracy([t["result"].frames for t in turns], [t["truth"]["level"] for t in turns], bins,
                                 cfg.pipeline.motion, requested_levels=[t["result"].motion_level for t in turns])
        states = state_accuracy([t["result"].predicted for t in turns], [t["truth"]["states"] for t in turns])
        metrics.update(motion=motion, states=states, acc_f=available(motion["acc_f"]), mae_f=available(motion["mae_f"]),
                       acc_f_requested=available(motion["acc_f_requested"]),
                       acc_s=available(states["acc_s"]), mae_s=available(states["mae_s"]))
        timings = {s: [t["result"].timings.get(s, 0.0) for t in turns] for s in STAGES}
        seconds = {s: statistics.mean(values) for s, values in timings.items()}
        metrics["seconds_per_turn"] = available(seconds["total"])
        metrics["seconds_per_stage"] = seconds
        # the typical turn: the first turns of a process also pay for warm-up (kernel choice, compiling)
        metrics["seconds_per_stage_median"] = {s: statistics.median(values) for s, values in timings.items()}
    return metrics


def reconstruction_metrics(cfg: RunConfig, scorers: Scorers) -> dict:
    """Table 3 (reconstruction): held-out clips decoded from their own representation by a phase (a)
    export, against the true clips; CLIP-I and DreamSim like Table 1."""
    e = cfg.evaluation
    # held as the game holds its renderer: on the playing device, LoRA merged, model.decoder.fp8 as in play
    device = torch.device(default_device())
    model, _ = renderer_for_play(build_reconstruction(cfg, [e.reconstruction_export], play=True), device,
                                 play_dtype(device))
    param = next(model.parameters())
    # The held-out clips' feature shards, read as phase (a) reads them.
    run = RunConfig(model=cfg.model, seed=cfg.seed, pipeline=cfg.pipeline, data=cfg.data,
                    phase=PhaseAConfig(input=FEATURES))
    vae = build_frozen_encoders(cfg.model.encoders, device=device, dtype=param.dtype, which=("vae",)).vae
    dataset = phase_a_dataset(run, "val")
    count = min(e.reconstruction_clips, len(dataset))
    keys = [dataset.locations[i].key for i in range(count)]
    clips = truth_clips(cfg, set(keys))
    items = [dataset[index] for index in range(count)]
    # Every clip sampled from its own representation, at each swept level, and from another's (two or more).
    swept = len(read_level_flow(clip_manifest(cfg.data.root, cfg.data.clips))) if e.motion_sweep else 0
    bar = tqdm(total=count * (1 + swept + (count >= 2)), desc="reconstruction", unit="clip", disable=None)

    def pixels(latents: torch.Tensor) -> np.ndarray:
        return (vae.decode(latents)[0].clamp(0, 1) * 255).round().to(torch.uint8).cpu().numpy()

    def reconstructed(index: int, source: int, flow: float | None = None) -> torch.Tensor:
        """Latents (1, T', C, H, W) of clip ``index`` (its latent shape, motion scope or ``flow``, and noise)
        sampled from clip ``source``'s representation: the same noise either way, so only the conditioning
        differs."""
        own, other = items[index], items[source]
        scope = own["flow"][None] if flow is None else torch.tensor([flow], dtype=own["flow"].dtype)
        clips = ClipBatch(own["latents"][None], other["text"][None].to(device, param.dtype),
                          other["image"][None].to(device, param.dtype), scope.to(device))
        with torch.no_grad():
            latents = model.reconstruct(clips, cfg.model.diffusion, step_generator(cfg.seed, index, 0), param.dtype,
                                        e.sampling_steps)
        bar.update()
        return latents

    def scored(frames: list[np.ndarray]) -> dict:
        """Clip i's frames against the true clip i: the mean scores and ACC-F / MAE-F."""
        rows = [{**scorers.turn(f, clips[keys[i]][0], "", ""), "psnr": clip_psnr(f, clips[keys[i]])}
                for i, f in enumerate(frames)]
        return {**mean_scores(rows), **reconstruction_motion(cfg, keys, frames)}

    own_latents = [reconstructed(index, index) for index in range(count)]
    own = scored([pixels(latents) for latents in own_latents])
    # The same motion measured on the latents, against the clips' own: no VAE decoder, no flow estimator.
    own["latent_motion"] = latent_motion([x[0].float().cpu() for x in own_latents],
                                         [items[i]["latents"].float() for i in range(count)])
    if e.motion_sweep:  # each clip again at every level's flow value: does the motion scope set the speed?
        levels = {meta["key"]: meta["motion"]["level"] for meta in clip_metas(cfg, set(keys))}
        truth = [(clips[keys[i]], items[i]["latents"], levels[keys[i]]) for i in range(count)]
        own.update(evaluation_sweep(cfg, count, lambda i, flow: reconstructed(i, i, flow), pixels, truth))
    shuffled = shuffled_reconstruction(cfg, count, lambda order: scored([pixels(reconstructed(i, j)) for i, j in enumerate(order)]))
    bar.close()
    with torch.no_grad():  # the clips' own latents through the VAE: what any renderer can give back at best
        ceiling = {"label": VAE_ROUND_TRIP_LABEL, **scored([pixels(items[i]["latents"][None]) for i in range(count)])}
    setup = describe_setup(cfg.model.name, {"encoder + decoder": model, "VAE": vae}, param.device, param.dtype,
                           **sampling_setup(cfg))
    return {"clips": count, "export": e.reconstruction_export, "setup": setup, **own,
            "baselines": {SHUFFLED: shuffled, VAE_ROUND_TRIP: ceiling}}


def evaluation_sweep(cfg, clips: int, render: Callable[[int, float], Any],
                     pixels: Callable[[Any], np.ndarray], truth: Sequence[tuple[np.ndarray, torch.Tensor, int]]) -> dict:
    """The sweep of an evaluation's reconstruction: ``render(clip, flow)`` gives latents (1, T', C, H, W) of
    held-out clip ``clip`` sampled at motion scope ``flow`` (its representation and noise fixed),
    ``pixels`` decodes them to uint8 frames (T, H, W, 3); ``truth`` holds each swept clip's own frames, latents
    (T', C, H, W) and level, measured for the detail persistence's reference. Returns the headline metrics and
    the detail (:data:`~animegamer.evaluation.motion_sweep.SWEEP_KEY`), with the level flows of ``cfg``'s clip
    manifest."""
    manifest = clip_manifest(cfg.data.root, cfg.data.clips)
    bins = json.loads(manifest.read_text())["motion_bins"]
    estimator = make_estimator(cfg.pipeline.motion)  # built once (RAFT loads weights)

    def decoded(clip: int, flow: float) -> tuple[torch.Tensor, np.ndarray]:  # each rendering decoded once
        latents = render(clip, flow)
        return latents[0].float().cpu(), pixels(latents)

    def pixel_flows(rendered: list) -> list[float]:
        return measure_levels([frames for _, frames in rendered], bins, cfg.pipeline.motion, estimator)[0]

    def frame_detail(frames: np.ndarray, latents: torch.Tensor) -> float:
        return frame_persistence(frames, frames.shape[2] / latents.shape[-1])  # sigma: one latent px, in output px

    result = sweep(decoded, clips, read_level_flow(manifest), {
        PIXEL_FLOW: pixel_flows,
        LATENT_SHIFT: lambda rendered: [clip_speed(latents) for latents, _ in rendered],
        PIXEL_PERSISTENCE: lambda rendered: [frame_detail(frames, latents) for latents, frames in rendered],
        LATENT_PERSISTENCE: lambda rendered: [latent_persistence(latents) for latents, _ in rendered]})
    levels = [level for _, _, level in truth]
    for name, measure in ((PIXEL_PERSISTENCE, frame_detail),
                          (LATENT_PERSISTENCE, lambda frames, latents: latent_persistence(latents))):
        try:
            with_truth(result, name, levels, [measure(frames, latents.float()) for frames, latents, _ in truth])
        except ValueError as error:  # a true clip without fine detail: the measure stands without its reference
            log.warning("motion sweep: no reference for %s: %s", name, error)
    return {**headline(result), SWEEP_KEY: result}


def reconstruction_motion(cfg: RunConfig, keys: list[str], frames: list[np.ndarray]) -> dict:
    """ACC-F / MAE-F of the reconstructions (each decoded with its own clip's motion scope) against their
    clips' levels: whether the decoder renders the asked speed, apart from what the game predicts."""
    if not keys:
        return {"acc_f": unavailable("no held-out clip"), "mae_f": unavailable("no held-out clip")}
    levels = {meta["key"]: meta["motion"]["level"] for meta in clip_metas(cfg, set(keys))}
    bins = json.loads(clip_manifest(cfg.data.root, cfg.data.clips).read_text())["motion_bins"]
    motion = motion_accuracy(frames, [levels[key] for key in keys], bins, cfg.pipeline.motion)
    return {"motion": motion, "acc_f": available(motion["acc_f"]), "mae_f": available(motion["mae_f"])}


def mean_scores(rows: list[dict]) -> dict:
    """Per reconstruction metric, the mean over clips (unavailable with the first reason)."""
    return {name: mean_metric([r[name] for r in rows], "no held-out clip") for name in RECONSTRUCTION_KEYS}


def shuffled_reconstruction(cfg: RunConfig, count: int, score) -> dict:
    """The shuffled-representation baseline: clip i decoded from clip j's representation (a derangement
    seeded by ``cfg.seed``, with clip i's motion scope and noise), scored against clip i by
    ``score(order)`` as the reconstruction is, so "own minus shuffled" of a metric is one subtraction."""
    label = "shuffled representation (clip i decoded from clip j's)"
    if count < 2:
        reason = f"{count} held-out clip: shuffling needs at least 2"
        return {"label": label, **{name: unavailable(reason) for name in (*RECONSTRUCTION_KEYS, "acc_f", "mae_f")}}
    order = derangement(count, cfg.seed)
    return {"label": label, "derangement": order, **score(order)}


def untrained_baseline(cfg: RunConfig, models, benchmark: dict, out: Path, scorers: Scorers, bins: dict,
                       truth: dict) -> dict:
    """The untrained game: the benchmark played with the MLLM as phase (b) started (its seed and
    init_from, no trained weights) and the trained renderer, scored by the same code as the game."""
    seed, init = recorded_start(cfg.evaluation.mllm_export)
    start = replace(models.cfg, seed=cfg.seed if seed is None else int(seed))
    untrained = replace(models, mllm=load_game_mllm(start, init, models.device, models.dtype),
                        sources={**models.sources, "mllm": init, "mllm_seed": start.seed})
    games, turns = play_benchmark(cfg, untrained, benchmark, out, scorers)
    what = f"init_from {init[0]}" if init else f"seed {start.seed}"
    return {"label": f"untrained game (MLLM at phase (b)'s start: {what})", "seed": start.seed, "init_from": init,
            **aggregate(cfg, turns, bins, truth),
            "games": {"planned_turns": sum(g["planned"] for g in games),
                      "completed_turns": sum(g["completed"] for g in games)}}


def game_setup(cfg: RunConfig, models) -> dict:
    """The model, precision and hardware the benchmark was played with (report.md's "Setup")."""
    parts = {"MLLM": models.mllm.model, "renderer (encoder + decoder)": models.renderer, "VAE": models.vae}
    return describe_setup(cfg.model.name, parts, models.device, models.dtype, **sampling_setup(cfg))


def sampling_setup(cfg: RunConfig) -> dict:
    """How the evaluation samples: steps, and the step cache when one is on (it changes the clips)."""
    d = cfg.model.diffusion
    found = {"sampling_steps": cfg.evaluation.sampling_steps or d.sampling_steps}
    if caching(d):
        found["sampling_cache"] = f"{d.cache} (threshold {d.cache_threshold:g})"
    return found


def write_reconstruction(cfg: RunConfig, scorers: Scorers, out: Path, record: dict | None = None) -> dict:
    """The Table 3 reconstruction metrics of ``evaluation.reconstruction_export``, written to ``out``
    (metrics.json and report.md beside the paper's numbers); ``record`` adds entries to metrics.json."""
    metrics = {**reconstruction_metrics(cfg, scorers), **(record or {})}
    write_report(out, metrics, [], paper=PAPER_TABLE3_RECONSTRUCTION, title="AnimeGamer reconstruction (Table 3)")
    return metrics


def evaluate(cfg: RunConfig) -> dict:
    """Play the benchmark with the configured exports and write metrics, report, plots and gallery."""
    use_threads()
    e = cfg.evaluation
    out = Path(e.out)
    forget_record(out)  # what is played now replaces the metrics an earlier record vouched for
    if e.benchmark:
        benchmark = read_benchmark(e.benchmark)
    else:
        benchmark = held_out_games(cfg)
        refuse(benchmark_problems(benchmark, benchmark["source"]))  # clip keys of shards made elsewhere name folders too
    out.mkdir(parents=True, exist_ok=True)  # only once the games' folders are known to stay inside it
    set_aside_earlier_outputs(out, benchmark, e.untrained_game, bool(e.reconstruction_export))
    (out / BENCHMARK_FILE).write_text(json.dumps(benchmark, indent=2))
    manifest = clip_manifest(cfg.data.root, cfg.data.clips)
    models = load_game_models(cfg, e.mllm_export, e.renderer_export, read_level_flow(manifest))
    bins = json.loads(manifest.read_text())["motion_bins"]
    scorers = Scorers(cfg)
    games, turns = play_benchmark(cfg, models, benchmark, out, scorers)
    truth = truth_clips(cfg, benchmark_keys(benchmark))
    metrics = aggregate(cfg, turns, bins, truth)
    metrics["games"] = {"planned_turns": sum(g["planned"] for g in games),
                        "completed_turns": sum(g["completed"] for g in games),
                        "renderer": e.renderer_export, "mllm": e.mllm_export}
    metrics["setup"] = game_setup(cfg, models)
    # Baselines on exactly the turns the model was scored on (a stopped game's played turns).
    scored = [game["turns"][: played["completed"]] for game, played in zip(benchmark["games"], games)]
    metrics["baselines"] = state_baselines(scored, training_states(cfg))
    if e.untrained_game:
        metrics["baselines"][UNTRAINED] = untrained_baseline(cfg, models, benchmark, out / UNTRAINED_FOLDER, scorers,
                                                             bins, truth)
    metrics["judge"] = judge_report_games(e.judge, games)  # Table 2; unavailable without an endpoint
    if e.reconstruction_export:
        metrics["reconstruction"] = write_reconstruction(cfg, scorers, out / RECONSTRUCTION_FOLDER)
    files = write_report(out, metrics, games)
    log.info("evaluation: %d/%d turns played; report %s", metrics["games"]["completed_turns"],
             metrics["games"]["planned_turns"], files.get("report_md", out))
    return {"metrics": metrics, "files": {k: str(v) for k, v in files.items()}, "out": str(out)}


def preflight(composed) -> None:
    """Logging, then every problem of the evaluation at once (:class:`~animegamer.config.validate.ConfigError`)."""
    setup_logging(composed.log_level)
    validate_eval_run(composed)


def run(composed) -> dict:
    """Validate (every problem at once) and evaluate, whatever an earlier evaluation left."""
    preflight(composed)
    return evaluate(OmegaConf.to_object(composed))
