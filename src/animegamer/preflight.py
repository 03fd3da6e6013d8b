"""Pre-flight of the recipe paths (quick start, fine-tuning, the Table 3 recipe, evaluation): what a
pipeline output folder allows, checked after the pipeline and before any training.

A run that cannot finish should fail in seconds with what to change, not after hours of training:
every phase needs captioned clips outside the held-out shots, phase (b) needs at least one session
made only of such clips, and evaluation needs held-out shots to play. The counts come from the files
the pipeline writes (the clip shards' json, ``shots.json``, ``sessions.json``) and the held-out rule
of :mod:`animegamer.data.split`, at each stage's own ``data.val_fraction``.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from animegamer.config.validate import ConfigError
from animegamer.data.indexed import key_fraction
from animegamer.contracts.files import SESSIONS_FILE
from animegamer.data.split import VAL, TRAIN, HeldOut, consecutive_runs, session_key
from animegamer.media.captions import STATUS_OK

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SplitOption:
    """One held-out fraction worth trying: just above one shot's hash, so that shot and the lower ones are held out."""

    val_fraction: float
    held_out_shots: int
    longest_train_run: int  # consecutive captioned training clips of one film under it


@dataclass(frozen=True)
class SplitCounts:
    """What one pipeline output folder holds for one held-out fraction."""

    folder: str  # the clip shards
    val_fraction: float
    clips: int
    captioned: int
    shots: dict[str, float]  # shot (or clip key, without shots.json) holding a captioned clip -> its split hash
    train_clips: int  # captioned clips outside held-out shots
    held_out_clips: int  # captioned clips of held-out shots
    longest_train_run: int  # consecutive captioned training clips of one film: the longest session possible
    turns: int  # pipeline.sessions.turns of sessions.json (0: no sessions index)
    train_sessions: int
    held_out_sessions: int

    @property
    def held_out_shots(self) -> int:
        return sum(f < self.val_fraction for f in self.shots.values())


@lru_cache(maxsize=8)
def _clip_metas(folder: str, manifest_sha256: str) -> tuple[dict, ...]:
    """The json of every clip in a shard folder or URL (no video read); cached per manifest version."""
    from animegamer.data.indexed import IndexedShardDataset

    clips = IndexedShardDataset(folder, _json_of, video=False, allow_empty=True, members=("json",))
    return tuple(clips[i] for i in range(len(clips)))


def _json_of(sample: dict) -> dict:
    return sample["json"]


def _read_clips(root: str | Path, clips_dir: str, val_fraction: float):
    """(shard folder, every clip's json, the split, the captioned clips' json) of a pipeline output."""
    from animegamer.contracts.files import MANIFEST
    from animegamer.data.storage import ShardSource, join
    from animegamer.utils.io import sha256_bytes

    folder = ShardSource(join(root, clips_dir))  # a folder or a URL
    problem = folder.manifest_problem()
    if problem is not None:
        raise ConfigError([problem if folder.remote else f"{problem}; the pipeline has not written clip shards there"])
    metas = _clip_metas(folder.folder, sha256_bytes(folder.read_bytes(MANIFEST)))
    captioned = [m for m in metas if m["captioner"]["status"] == STATUS_OK]
    return folder, metas, HeldOut(root, clips_dir, val_fraction), captioned


def split_counts(root: str | Path, clips_dir: str, val_fraction: float) -> SplitCounts:
    """Counts of the pipeline output at ``root`` under the held-out split at ``val_fraction``."""
    from animegamer.data.storage import ShardSource

    folder, metas, split, captioned = _read_clips(root, clips_dir, val_fraction)
    shots = {split.unit(m["key"]): key_fraction(split.unit(m["key"])) for m in captioned}
    held = [split.clip(m["key"]) for m in captioned]
    runs = consecutive_runs(captioned, lambda m: not split.clip(m["key"]))
    sessions = ShardSource(str(root)).read_json_if_exists(SESSIONS_FILE) or {"turns": 0, "sessions": []}
    keys = [session_key(s["keys"]) for s in sessions["sessions"]]
    return SplitCounts(
        folder=str(folder), val_fraction=val_fraction, clips=len(metas), captioned=len(captioned), shots=shots,
        train_clips=held.count(False), held_out_clips=held.count(True),
        longest_train_run=max((len(r) for r in runs), default=0), turns=int(sessions["turns"]),
        train_sessions=sum(map(split.keep_session(TRAIN), keys)),
        held_out_sessions=sum(map(split.keep_session(VAL), keys)))


def split_options(captioned: list[dict], fraction_of: dict[str, float]) -> tuple[SplitOption, ...]:
    """Every held-out fraction on the 0.01 grid that holds out some shots and trains on the others (at
    most 99: a split is by whole shots, so only fractions with a shot hash between them differ), with
    what it holds out and the longest run of training clips it leaves."""
    hashes = sorted(set(fraction_of.values()))
    clips = sorted(captioned, key=lambda m: (m["film"], m["clip"]))
    grid = sorted({_just_above(h) for h in hashes[:-1]})  # above the highest: nothing to train on
    options = []
    for fraction in grid:
        longest = length = 0
        last = None
        for meta in clips:
            if fraction_of[meta["key"]] < fraction:  # held out
                length, last = 0, None
                continue
            follows = last is not None and last["film"] == meta["film"] and last["clip"] + 1 == meta["clip"]
            length, last = (length + 1 if follows else 1), meta
            longest = max(longest, length)
        options.append(SplitOption(fraction, sum(h < fraction for h in hashes), longest))
    return tuple(options)


def _just_above(value: float) -> float:
    """The first fraction of the 0.01 grid above ``value`` (a hash on the grid, 0.29, gives 0.3)."""
    step = math.floor(round(value * 100, 9)) + 1  # round: 0.29 * 100 is 28.999999999999996
    return step / 100


def options_of(cfg) -> tuple[SplitOption, ...]:
    """:func:`split_options` of a config's pipeline output (computed only when a split problem asks)."""
    _, _, split, captioned = _read_clips(cfg.data.root, cfg.data.clips, cfg.data.val_fraction)
    return split_options(captioned, {m["key"]: key_fraction(split.unit(m["key"])) for m in captioned})


def split_suggestion(c: SplitCounts, options: tuple[SplitOption, ...], turns: int | None) -> str | None:
    """One held-out fraction (and, for phase (b)'s ``turns``, a session length) under which every stage
    has what it needs, or None when there is none to give: each stage's own fix, alone, can undo another's.
    ``turns`` None: no phase (b), any training clip will do."""
    need = max(turns or 1, 1)
    fits = [o for o in options if o.longest_train_run >= need]
    if fits:
        o = min(fits, key=lambda o: o.held_out_shots)
        enough = f", enough for pipeline.sessions.turns={need}" if turns else ""
        return (f"data.val_fraction={o.val_fraction:g} holds out {o.held_out_shots} of {len(c.shots)} shots and leaves "
                f"a run of {o.longest_train_run} training clips{enough}")
    best = max(options, key=lambda o: o.longest_train_run, default=None)
    if best is None or not best.longest_train_run:
        return None
    return (f"no held-out fraction leaves a run of {need} training clips; the longest, {best.longest_train_run}, comes "
            f"with data.val_fraction={best.val_fraction:g} and pipeline.sessions.turns={best.longest_train_run} (or "
            f"lower pipeline.clips.stride_seconds for more clips per shot)")


def counts_of(cfg) -> SplitCounts:
    return split_counts(cfg.data.root, cfg.data.clips, cfg.data.val_fraction)


# --------------------------------------------------------------------------- what each use needs
def _too_few_shots(c: SplitCounts) -> list[str]:
    if len(c.shots) > 1:
        return []
    return [f"{c.folder}: the captioned clips come from {len(c.shots)} shot(s); whole shots are held out, so "
            f"training needs a shot outside the held-out split and validation/evaluation one inside it: add "
            f"footage with more cuts (or more films), or captions covering more of the film"]


def captions_problems(c: SplitCounts) -> list[str]:
    if c.captioned:
        return []
    return [f"{c.folder}: none of the {c.clips} clips has a caption (see report.json's caption failures): the "
            f"caption file must name each film (its id, file name or stem) and its time spans must cover the "
            f"clips' midpoints"]


def _split_side_problems(c: SplitCounts, what: str, held: bool, trained: bool = False) -> list[str]:
    """Captioned clips on one side of the split: to train on (``held`` False) or held out. ``trained``:
    the held-out clips are for exports already trained, which the evaluation may not hold out more than."""
    if not c.captioned or (c.held_out_clips if held else c.train_clips):
        return []
    low, high = min(c.shots.values()), max(c.shots.values())
    if not held:
        fix = (f"every shot is held out at data.val_fraction={c.val_fraction} (shot hashes from {low:.3f}): lower "
               f"data.val_fraction below {high:.3f}")
    else:
        fix = (f"no shot is held out at data.val_fraction={c.val_fraction} (the {len(c.shots)} shots hash from "
               f"{low:.3f}): ")
        fix += (f"an evaluation may not hold out more than its exports' training did, so evaluate exports trained "
                f"with data.val_fraction above {low:.3f} (and set it here too), evaluate on another pipeline output, "
                f"or pass evaluation.benchmark") if trained else f"raise data.val_fraction above {low:.3f}"
    return _too_few_shots(c) or [f"{what}: {fix}"]


def training_problems(c: SplitCounts, what: str) -> list[str]:
    """Clips to train on: captioned clips outside the held-out shots."""
    return _split_side_problems(c, what, held=False)


def held_out_problems(c: SplitCounts, what: str, trained: bool = False) -> list[str]:
    """Held-out clips to validate or evaluate on (``trained``: to evaluate exports already trained)."""
    return _split_side_problems(c, what, held=True, trained=trained)


def session_problems(c: SplitCounts) -> list[str]:
    """Phase (b) trains on sessions of ``turns`` consecutive captioned clips, none of a held-out shot."""
    if not c.captioned or not c.train_clips or c.train_sessions:
        return []
    if not c.turns:
        return [f"{Path(c.folder).parent / SESSIONS_FILE}: missing; run the pipeline's sessions step"]
    return [f"phase b: no training session: a session is pipeline.sessions.turns={c.turns} consecutive captioned "
            f"clips of one film outside the held-out shots, and the longest such run here has "
            f"{c.longest_train_run} clip(s): lower pipeline.sessions.turns to {max(c.longest_train_run, 1)} or less, "
            f"lower pipeline.clips.stride_seconds for more clips, lower data.val_fraction, or add captions "
            f"covering more of the film"]


def evaluation_problems(cfg, trained: bool = True) -> list[str]:
    """What an evaluation needs from its data: captioned clips of held-out shots to play. ``trained``: its
    exports are already trained (False: checked before the recipe trains them, with the same split)."""
    c = counts_of(cfg)
    return captions_problems(c) + held_out_problems(c, "evaluation", trained)


def validation_gap(cfg, c: SplitCounts, sessions: bool = False) -> str | None:
    """Why a stage trained with ``cfg`` on the data counted in ``c`` validates nothing (None: it validates):
    no held-out clip (``sessions``, phase (b): no session made only of held-out clips), or a validation
    interval past its last step."""
    if sessions and not c.held_out_sessions:
        return (f"no session is made only of held-out clips at data.val_fraction={c.val_fraction} "
                f"({c.held_out_clips} held-out clip(s) in {c.held_out_shots} shot(s))")
    if not sessions and not c.held_out_clips:
        return f"no held-out clip at data.val_fraction={c.val_fraction}"
    p = cfg.phase
    if p.val_every_n_steps > p.max_steps:
        return f"phase.val_every_n_steps={p.val_every_n_steps} is above phase.max_steps={p.max_steps}"
    return None


def raise_problems(problems: list[str]) -> None:
    unique = list(dict.fromkeys(problems))
    if unique:
        raise ConfigError(unique)


def check_recipe(phase_a, phase_b=None, evaluation=None) -> dict[str, SplitCounts]:
    """Everything the recipe's stages need from the pipeline output, before the first one trains.

    Each argument is that stage's composed config (None: the stage does not run). Raises
    :class:`ConfigError` listing every problem; warns where a stage will run without validation."""
    counts = {"phase a": counts_of(phase_a)}
    c = counts["phase a"]
    problems = captions_problems(c)
    split = training_problems(c, "phase a")  # what the held-out fraction or the session length would fix
    if c.captioned and (gap := validation_gap(phase_a, c)):
        log.warning("phase a: %s: validation is skipped", gap)
    b = None
    if phase_b is not None:
        counts["phase b"] = b = counts_of(phase_b)
        split += training_problems(b, "phase b") + session_problems(b)
        if b.train_sessions and (gap := validation_gap(phase_b, b, sessions=True)):
            log.warning("phase b: %s: validation is skipped", gap)
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
        log.info("pre-flight %s: %d clips, %d captioned in %d shot(s); %d to train on, %d held out; %d training "
                 "and %d held-out session(s)", stage, n.clips, n.captioned, len(n.shots), n.train_clips,
                 n.held_out_clips, n.train_sessions, n.held_out_sessions)
    return counts
