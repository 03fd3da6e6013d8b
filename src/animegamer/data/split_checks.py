"""What each use of a pipeline output needs from it, and what to change where it falls short: captioned
clips to train on outside the held-out shots, held-out clips to validate or evaluate on, phase (b)'s
sessions, and one held-out fraction (with a session length) under which every stage has what it needs.

A run that cannot finish should fail in seconds with what to change, not after hours of training. The
counts are :mod:`animegamer.data.split_counts`', at each stage's own ``data.val_fraction``; the recipes'
and the evaluation's pre-flights compose these problems.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from animegamer.contracts.files import SESSIONS_FILE
from animegamer.contracts.shards import CLIP, FILM, KEY
from animegamer.data.indexed import key_fraction
from animegamer.data.split_counts import SplitCounts, read_clips, split_counts


@dataclass(frozen=True)
class SplitOption:
    """One held-out fraction worth trying: just above one shot's hash, so that shot and the lower ones are held out."""

    val_fraction: float
    held_out_shots: int
    longest_train_run: int  # consecutive captioned training clips of one film under it


def split_options(captioned: list[dict], fraction_of: dict[str, float]) -> tuple[SplitOption, ...]:
    """Every held-out fraction on the 0.01 grid that holds out some shots and trains on the others (at
    most 99: a split is by whole shots, so only fractions with a shot hash between them differ), with
    what it holds out and the longest run of training clips it leaves."""
    hashes = sorted(set(fraction_of.values()))
    clips = sorted(captioned, key=lambda m: (m[FILM], m[CLIP]))
    grid = sorted({_just_above(h) for h in hashes[:-1]})  # above the highest: nothing to train on
    options = []
    for fraction in grid:
        longest = length = 0
        last = None
        for meta in clips:
            if fraction_of[meta[KEY]] < fraction:  # held out
                length, last = 0, None
                continue
            follows = last is not None and last[FILM] == meta[FILM] and last[CLIP] + 1 == meta[CLIP]
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
    _, _, split, captioned = read_clips(cfg.data.root, cfg.data.clips, cfg.data.val_fraction)
    return split_options(captioned, {m[KEY]: key_fraction(split.unit(m[KEY])) for m in captioned})


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
