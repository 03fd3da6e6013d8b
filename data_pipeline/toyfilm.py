"""Procedurally drawn cartoon "toy film": quick-start data and ground truth for pipeline tests.

The clip-and-caption pipeline (shot detection with PySceneDetect's ``ContentDetector``, 2-second
clips at 8 fps, motion level 1..5 from the mean Farneback optical-flow magnitude, captions imported
from a JSONL file) needs a film whose answers are known exactly. :func:`make_toy_film` draws one in
a few seconds on one CPU core:

* about ten shots of 4-6 s, each a distinct scene (own colour palette, smooth-noise texture so
  optical flow is well defined), separated by hard cuts that ``ContentDetector`` (threshold 27)
  finds exactly, while the texture never triggers a false cut;
* one or two cartoon characters per shot, from a small named cast;
* one constant on-screen speed per shot: the camera pans the textured background and the
  characters walk (bouncing off the frame edges) at that speed. The speeds are roughly geometric,
  one per motion level, so the mean flow magnitude separates the five levels robustly, and every
  level appears in at least two shots. Level-1 shots are completely static.

Three files are written to ``out_dir``:

``{film_id}.mp4``
    H.264, yuv420p, constant frame rate, written with PyAV by a single-threaded x264 so the bytes
    are reproducible for the same arguments and library versions.
``{film_id}.truth.json``
    Ground truth: ``fps``, ``width``, ``height``, ``num_frames``, ``duration`` (seconds),
    ``cut_frames`` (first frame of every shot after the first) and ``shots``, each with
    ``start_frame``, ``end_frame`` (exclusive), ``speed_px_per_frame``, ``level`` (1..5) and its
    ``caption`` record. Read it back with :meth:`ToyFilm.load`.
``{film_id}.captions.jsonl``
    The captions, in the caption-import format described below.

Caption-import format (JSONL)
-----------------------------
This is the format end users write for their own films. One JSON object per line, one line per
captioned time span (here: one per shot, spanning the whole shot)::

    {"film": "toyfilm", "start": 0.0, "end": 4.5, "character": "Qiqi", "motion": "walk",
     "adverb": "slowly", "environment": "forest", "time_of_day": "morning",
     "states": {"SC": 0, "ET": 1, "ST": 1}}

``film`` (str)
    Film id; the video file is ``{film}.mp4`` next to the captions file.
``start``, ``end`` (float)
    Span in seconds from the start of the video, ``start < end``.
``character`` (str)
    Name of the main character of the span. The toy film names everyone in the shot, main
    character first (``"Qiqi and Pazu"``), so the instruction built from it tells whether a
    second character is there (see ``CHARACTER_JOINER``).
``motion`` (str), ``adverb`` (str)
    What the character does and how, e.g. ``"stand"``/``"quietly"``, ``"walk"``/``"slowly"``,
    ``"run"``/``"quickly"``, ``"dash"``/``"rapidly"``. Should agree with the amount of motion.
``environment`` (str), ``time_of_day`` (str)
    Where and when, e.g. ``"forest"``, ``"seaside"``, ``"kitchen"``; ``"morning"``, ``"night"``.
``states`` (object)
    Character-state changes over the span: ``SC`` social, 1 when the character talks or interacts
    with another character, else 0; ``ET`` entertainment, 1 when the span is fun for the
    character, else 0; ``ST`` stamina, -1 when exertion (fast motion) tires the character, +1 when
    it rests.

Command line: ``python -m data_pipeline.toyfilm OUT_DIR [--film-id ID] [--seed N] [--variant N]``.
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import time
from dataclasses import dataclass
from functools import lru_cache
from itertools import combinations
from fractions import Fraction
from pathlib import Path
from typing import Any, Iterator, Sequence

import cv2
import numpy as np

from animegamer.config.validate import seed_problems
from animegamer.errors import UserError, exit_on_user_error
from animegamer.utils.logging import setup_logging

logger = logging.getLogger(__name__)

# --------------------------------------------------------------------------- film layout
NUM_SHOTS = 10
# Shot lengths stay clear of 4 s and 6 s so that every shot holds exactly two 2-s clip windows
# (17 frames at 8 fps, a couple of frames away from each cut): all levels then have the same
# number of clips, and quantile motion bins fall exactly between the levels.
SHOT_SECONDS_MIN = 4.5
SHOT_SECONDS_MAX = 5.75
NUM_LEVELS = 5
# On-screen speed per motion level (index = level - 1), in px per source frame at 480 px width;
# scaled with the width. Steps of x2.3 .. x3.4 keep the levels far apart in flow space, and put
# each level mid-way between the pipeline's fixed motion edges (0.5, 2.5, 10, 20 px per 8-fps
# frame at 720x480 output, i.e. x1.76 x3 these speeds: 1.9, 6.4, 16, 37).
# The top speed is capped: at 256 px width and 3 frames apart it moves ~11 px, about the most
# that Farneback still tracks there (its pyramid stops at ~32 px images, whatever ``levels``
# says); beyond ~13 px it underestimates erratically.
REFERENCE_WIDTH = 480
LEVEL_SPEEDS_AT_REFERENCE = (0.0, 0.35, 1.2, 3.0, 7.0)
# Levels at or above this tire the character (ST = -1); below it the character rests (ST = +1).
TIRING_LEVEL = 4
# Fraction of the shots that show two interacting characters (SC = 1).
TWO_CHARACTER_FRACTION = 0.4
CAST_SIZE_PER_FILM = 3
# The caption's character field names everyone in the shot, main character first. The game model
# predicts a turn's states from its instruction and the earlier turns, never from the turn's own
# frames, so SC ("interacts with a second character") is learnable only if the partner is named.
CHARACTER_JOINER = " and "

# What the main character does at each level (index = level - 1): (motion, adverb).
LEVEL_VOCABULARY = (
    ("stand", "quietly"),
    ("stroll", "slowly"),
    ("walk", "steadily"),
    ("run", "quickly"),
    ("dash", "rapidly"),
)

# --------------------------------------------------------------------------- drawing
HORIZON_FRACTION = 0.5  # sky above, ground below, as a fraction of the frame height
HORIZON_JITTER = 0.06  # +- fraction of the height the horizon moves between scenes
TEXTURE_SIGMAS_AT_REFERENCE = (2.5, 7.0)  # smooth-noise scales (px at 480 width): flow detail
TEXTURE_GAIN = 0.5  # noise std in units of the dark-to-light tone span, before clipping
TONE_VALUE_SPREAD = 34  # HSV value (0..255) between the dark and the light tone of a band
TONE_SATURATION_SPREAD = 20
SKY_GRADIENT_VALUE = 24  # the sky brightens by this much (HSV value) towards the horizon
PAN_MARGIN_PX = 8  # spare canvas on each side so bilinear sampling never reads the border

CHARACTER_HEIGHT_FRACTION = 0.34  # character size unit, as a fraction of the frame height
BODY_WIDTH_FRACTION = 0.55  # body width and height in that unit; head and ears scale with them
BODY_HEIGHT_FRACTION = 0.45
CHARACTER_EDGE_MARGIN = 0.6  # keep the body this many body-widths from the frame edge
FEET_BELOW_HORIZON = 0.16  # first character's feet, below the horizon, in frame heights
SECOND_ROW_STEP = 0.12  # the second character stands this much lower (nearer the camera)
OUTLINE_BGR = (32, 28, 36)
OUTLINE_PX = 2
EYE_WHITE_BGR = (250, 250, 250)
SUBPIXEL_BITS = 4  # cv2 fixed-point drawing: positions in 1/16 px so slow motion stays smooth

# --------------------------------------------------------------------------- scene cuts
# Adjacent scenes must score at least this on ContentDetector's metric (estimated from flat
# colours), far above its default threshold of 27, so a cut is never missed.
MIN_CUT_SCORE = 45.0
ORDER_SEARCH_TRIES = 2000
HUE_JITTER = 6  # +- OpenCV hue units (0..179) each variant shifts the scene palettes by

# --------------------------------------------------------------------------- encoding
X264_OPTIONS = {
    "crf": "18",
    "preset": "veryfast",
    # One thread (and thus no frame or sliced threading) makes the bitstream reproducible ...
    "threads": "1",
    # ... and so does turning off macroblock-tree rate control, whose assembly reads
    # uninitialised memory: with it on, identical input gave different bytes between runs.
    "x264-params": "mbtree=0",
}
KEYFRAME_INTERVAL_SECONDS = 2  # short GOPs keep random access (clip extraction) cheap

TRUTH_SCHEMA_VERSION = 1


# =========================================================================== catalog
HSV = tuple[int, int, int]  # OpenCV ranges: hue 0..179, saturation and value 0..255
Color = tuple[float, float, float]  # BGR, 0..255


@dataclass(frozen=True)
class Setting:
    """A scene's place and time, with the HSV colours (OpenCV ranges) of its two bands."""

    environment: str
    time_of_day: str
    sky_hsv: HSV
    ground_hsv: HSV
    leisure: bool  # fun place: the entertainment state ET is 1 there


@dataclass(frozen=True)
class CastMember:
    """A cartoon character: name, body colour (HSV) and ear shape, all distinct within the cast."""

    name: str
    body_hsv: HSV
    ears: str  # "round", "pointy" or "long"


SETTINGS: tuple[Setting, ...] = (
    Setting("forest", "morning", (34, 70, 225), (62, 190, 105), False),
    Setting("seaside", "noon", (100, 120, 240), (22, 110, 215), True),
    Setting("kitchen", "evening", (12, 160, 200), (10, 170, 115), False),
    Setting("snowfield", "morning", (108, 45, 225), (100, 18, 245), True),
    Setting("city street", "night", (116, 190, 90), (135, 70, 110), False),
    Setting("meadow", "noon", (90, 140, 235), (40, 190, 175), True),
    Setting("desert", "evening", (165, 110, 225), (18, 200, 185), False),
    Setting("cave", "night", (140, 70, 95), (24, 80, 100), False),
    Setting("fairground", "evening", (150, 150, 160), (175, 160, 175), True),
    Setting("library", "morning", (84, 150, 135), (15, 140, 150), False),
    Setting("harbor", "night", (105, 170, 110), (95, 60, 140), False),
    Setting("rooftop garden", "noon", (25, 60, 245), (50, 160, 150), True),
)

CAST: tuple[CastMember, ...] = (
    CastMember("Qiqi", (0, 190, 220), "pointy"),
    CastMember("Pazu", (105, 170, 200), "round"),
    CastMember("Momo", (30, 200, 240), "long"),
    CastMember("Lulu", (150, 130, 215), "round"),
    CastMember("Tobi", (15, 180, 160), "pointy"),
    CastMember("Rin", (70, 160, 190), "long"),
)

Palette = tuple[Setting, HSV, HSV]  # a setting with its (variant-shifted) sky and ground colours


# =========================================================================== ground truth types
@dataclass(frozen=True)
class Caption:
    """One caption-import record (see the module docstring for the JSONL format)."""

    film: str
    start: float
    end: float
    character: str
    motion: str
    adverb: str
    environment: str
    time_of_day: str
    sc: int
    et: int
    st: int

    def to_record(self) -> dict[str, Any]:
        """The JSON object of one JSONL line."""
        return {
            "film": self.film,
            "start": self.start,
            "end": self.end,
            "character": self.character,
            "motion": self.motion,
            "adverb": self.adverb,
            "environment": self.environment,
            "time_of_day": self.time_of_day,
            "states": {"SC": self.sc, "ET": self.et, "ST": self.st},
        }

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Caption:
        states = record["states"]
        return cls(
            film=str(record["film"]),
            start=float(record["start"]),
            end=float(record["end"]),
            character=str(record["character"]),
            motion=str(record["motion"]),
            adverb=str(record["adverb"]),
            environment=str(record["environment"]),
            time_of_day=str(record["time_of_day"]),
            sc=int(states["SC"]),
            et=int(states["ET"]),
            st=int(states["ST"]),
        )


@dataclass(frozen=True)
class Shot:
    """One shot: frames ``[start_frame, end_frame)``, its constant on-screen speed and caption."""

    index: int
    start_frame: int
    end_frame: int
    speed_px_per_frame: float
    level: int
    characters: tuple[str, ...]
    environment: str
    time_of_day: str
    pan_direction: int  # +1: background flows right on screen, -1: left (0 when static)
    caption: Caption

    @property
    def num_frames(self) -> int:
        return self.end_frame - self.start_frame

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "start_frame": self.start_frame,
            "end_frame": self.end_frame,
            "speed_px_per_frame": self.speed_px_per_frame,
            "level": self.level,
            "characters": list(self.characters),
            "environment": self.environment,
            "time_of_day": self.time_of_day,
            "pan_direction": self.pan_direction,
            "caption": self.caption.to_record(),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Shot:
        return cls(
            index=int(data["index"]),
            start_frame=int(data["start_frame"]),
            end_frame=int(data["end_frame"]),
            speed_px_per_frame=float(data["speed_px_per_frame"]),
            level=int(data["level"]),
            characters=tuple(data["characters"]),
            environment=str(data["environment"]),
            time_of_day=str(data["time_of_day"]),
            pan_direction=int(data["pan_direction"]),
            caption=Caption.from_record(data["caption"]),
        )


@dataclass(frozen=True)
class ToyFilm:
    """A generated toy film: where its files are and everything that is true about it."""

    film_id: str
    seed: int
    variant: int
    fps: int
    width: int
    height: int
    num_frames: int
    shots: tuple[Shot, ...]
    video_path: Path
    captions_path: Path
    truth_path: Path
    pan_direction: int = 0  # 0: each moving shot's pan drawn left or right; +1 / -1: every one that way

    @property
    def duration(self) -> float:
        """Length in seconds."""
        return self.num_frames / self.fps

    @property
    def cut_frames(self) -> tuple[int, ...]:
        """First frame of every shot after the first (where a shot detector must cut)."""
        return tuple(shot.start_frame for shot in self.shots[1:])

    @property
    def captions(self) -> tuple[Caption, ...]:
        return tuple(shot.caption for shot in self.shots)

    def to_json(self) -> dict[str, Any]:
        """The truth.json content; file names are relative to the truth file's folder."""
        return {
            "schema_version": TRUTH_SCHEMA_VERSION,
            "film_id": self.film_id,
            "seed": self.seed,
            "variant": self.variant,
            "fps": self.fps,
            "width": self.width,
            "height": self.height,
            "num_frames": self.num_frames,
            "duration": self.duration,
            "level_speeds_px_per_frame": list(level_speeds(self.width)),
            "pan_direction": self.pan_direction,
            "video": self.video_path.name,
            "captions": self.captions_path.name,
            "cut_frames": list(self.cut_frames),
            "shots": [shot.to_json() for shot in self.shots],
        }

    @classmethod
    def load(cls, truth_json_path: str | Path) -> ToyFilm:
        """Read a ``{film_id}.truth.json`` written by :func:`make_toy_film`."""
        truth_path = Path(truth_json_path)
        data = json.loads(truth_path.read_text(encoding="utf-8"))
        folder = truth_path.parent
        return cls(
            film_id=str(data["film_id"]),
            seed=int(data["seed"]),
            variant=int(data["variant"]),
            fps=int(data["fps"]),
            width=int(data["width"]),
            height=int(data["height"]),
            num_frames=int(data["num_frames"]),
            shots=tuple(Shot.from_json(shot) for shot in data["shots"]),
            video_path=folder / data["video"],
            captions_path=folder / data["captions"],
            truth_path=truth_path,
            pan_direction=int(data.get("pan_direction", 0)),  # truth files from before the option: drawn
        )


def level_speeds(width: int) -> tuple[float, ...]:
    """On-screen speed (px per source frame) of each level, scaled from the 480-px reference."""
    return tuple(round(speed * width / REFERENCE_WIDTH, 4) for speed in LEVEL_SPEEDS_AT_REFERENCE)


# =========================================================================== planning
@dataclass(frozen=True)
class _ShotPlan:
    """Everything needed to draw one shot (positions are in pixels of the output frame)."""

    start_frame: int
    num_frames: int
    level: int
    speed: float
    pan_direction: int
    setting: Setting
    sky_hsv: HSV
    ground_hsv: HSV
    horizon_y: float
    cast: tuple[CastMember, ...]
    start_x: tuple[float, ...]
    walk_direction: tuple[int, ...]
    noise_seed: int


def _hsv_to_bgr(hsv: Sequence[int]) -> np.ndarray:
    """One OpenCV-range HSV colour as a float32 BGR triple."""
    pixel = np.array([[hsv]], dtype=np.uint8)
    return cv2.cvtColor(pixel, cv2.COLOR_HSV2BGR)[0, 0].astype(np.float32)


def _shift_hue(hsv: HSV, delta: int) -> HSV:
    hue, sat, val = hsv
    return ((hue + delta) % 180, sat, val)


def _content_score(a_bgr: np.ndarray, b_bgr: np.ndarray) -> float:
    """ContentDetector's frame score (mean |dH|, |dS|, |dV| averaged) between two BGR images."""
    a_hsv = cv2.cvtColor(a_bgr, cv2.COLOR_BGR2HSV).astype(np.int32)
    b_hsv = cv2.cvtColor(b_bgr, cv2.COLOR_BGR2HSV).astype(np.int32)
    return float(np.abs(a_hsv - b_hsv).mean())


def _swatch(sky_hsv: HSV, ground_hsv: HSV) -> np.ndarray:
    """A tiny flat two-band picture of a scene, to estimate how hard a cut between scenes is."""
    swatch = np.empty((2, 1, 3), dtype=np.uint8)
    swatch[0, 0] = _hsv_to_bgr(sky_hsv)
    swatch[1, 0] = _hsv_to_bgr(ground_hsv)
    return swatch


def _order_scenes(rng: np.random.Generator, palettes: list[Palette], count: int) -> list[Palette]:
    """Pick ``count`` scenes in an order where every adjacent pair makes an unmistakable cut.

    Random orders are tried until every neighbouring pair scores at least ``MIN_CUT_SCORE`` on
    ContentDetector's metric (far above its threshold), so variants and seeds stay detectable.
    """
    swatches = [_swatch(sky, ground) for _, sky, ground in palettes]
    n = len(palettes)
    score = np.array([[_content_score(a, b) for b in swatches] for a in swatches])
    best_order: list[int] = []
    best_worst = -1.0
    for _ in range(ORDER_SEARCH_TRIES):
        order = [int(i) for i in rng.permutation(n)[:count]]
        worst = min(score[a, b] for a, b in zip(order, order[1:]))
        if worst > best_worst:
            best_order, best_worst = order, worst
        if worst >= MIN_CUT_SCORE:
            break
    if best_worst < MIN_CUT_SCORE:
        logger.warning("weakest scene cut scores %.1f (< %.1f)", best_worst, MIN_CUT_SCORE)
    return [palettes[i] for i in best_order]


def _shot_lengths(rng: np.random.Generator, fps: int) -> list[int]:
    low = int(round(SHOT_SECONDS_MIN * fps))
    high = int(round(SHOT_SECONDS_MAX * fps))
    return [int(n) for n in rng.integers(low, high + 1, size=NUM_SHOTS)]


def _shot_levels(rng: np.random.Generator) -> list[int]:
    """Every level at least twice (NUM_SHOTS // NUM_LEVELS times), in random order."""
    repeats = NUM_SHOTS // NUM_LEVELS
    levels = [level for level in range(1, NUM_LEVELS + 1) for _ in range(repeats)]
    levels += [int(level) for level in rng.integers(1, NUM_LEVELS + 1, NUM_SHOTS - len(levels))]
    return [int(level) for level in rng.permutation(levels)]


@lru_cache(maxsize=1)
def _cast_groups() -> tuple[tuple[int, ...], ...]:
    """Every group of ``CAST_SIZE_PER_FILM`` cast members, each followed by its complement when that
    is a group too: consecutive variants (0 and 1, 2 and 3, ...) then share no character, and a set
    of films with consecutive variants meets every character in many different company."""
    everyone = set(range(len(CAST)))
    order: list[tuple[int, ...]] = []
    for group in combinations(range(len(CAST)), CAST_SIZE_PER_FILM):
        if group in order:
            continue
        order.append(group)
        rest = tuple(sorted(everyone - set(group)))
        if len(rest) == CAST_SIZE_PER_FILM and rest not in order:
            order.append(rest)
    return tuple(order)


def _film_cast(variant: int) -> tuple[CastMember, ...]:
    """The variant's group of characters (cycling through all groups)."""
    groups = _cast_groups()
    return tuple(CAST[i] for i in groups[variant % len(groups)])


def _character_width(height: int) -> float:
    """Body width in px; also sets the margin that keeps characters inside the frame."""
    return CHARACTER_HEIGHT_FRACTION * BODY_WIDTH_FRACTION * height


def _walk_margin(height: int) -> float:
    """Smallest distance of a character's centre from the left/right frame edge."""
    return (CHARACTER_EDGE_MARGIN + 0.5) * _character_width(height)


def _plan_shot(
    rng: np.random.Generator, start_frame: int, num_frames: int, level: int, scene: Palette,
    cast: tuple[CastMember, ...], width: int, height: int, pan_direction: int = 0,
) -> _ShotPlan:
    """Place one shot's horizon and characters and pick its pan and walking directions (the pan's
    ``pan_direction`` when not 0; it is drawn all the same, so the rest of the film does not change)."""
    setting, sky, ground = scene
    margin = _walk_margin(height)
    # Two characters start on opposite halves of the frame, so they meet while walking.
    halves = [(margin, width / 2), (width / 2, width - margin)]
    rng.shuffle(halves)
    speed = level_speeds(width)[level - 1]
    drawn = int(rng.choice([-1, 1])) if speed > 0 else 0
    return _ShotPlan(
        start_frame=start_frame,
        num_frames=num_frames,
        level=level,
        speed=speed,
        pan_direction=(pan_direction or drawn) if speed > 0 else 0,
        setting=setting,
        sky_hsv=sky,
        ground_hsv=ground,
        horizon_y=float(height * (HORIZON_FRACTION + rng.uniform(-HORIZON_JITTER, HORIZON_JITTER))),
        cast=cast,
        start_x=tuple(float(rng.uniform(*halves[i])) for i in range(len(cast))),
        walk_direction=tuple(int(rng.choice([-1, 1])) for _ in cast),
        noise_seed=int(rng.integers(2**31)),
    )


def _plan_shots(seed: int, variant: int, width: int, height: int, fps: int, pan_direction: int = 0) -> list[_ShotPlan]:
    """Decide lengths, levels, scenes and cast of all shots, then lay out each shot."""
    rng = np.random.default_rng([seed, variant])
    hue_delta = int(rng.integers(-HUE_JITTER, HUE_JITTER + 1)) if variant else 0
    palettes = [
        (s, _shift_hue(s.sky_hsv, hue_delta), _shift_hue(s.ground_hsv, hue_delta)) for s in SETTINGS
    ]
    scenes = _order_scenes(rng, palettes, NUM_SHOTS)
    lengths = _shot_lengths(rng, fps)
    levels = _shot_levels(rng)
    film_cast = _film_cast(variant)
    n_pairs = int(round(TWO_CHARACTER_FRACTION * NUM_SHOTS))
    two_character = {int(i) for i in rng.choice(NUM_SHOTS, size=n_pairs, replace=False)}

    plans = []
    start = 0
    for index, (scene, length, level) in enumerate(zip(scenes, lengths, levels)):
        n_chars = 2 if index in two_character else 1
        cast = tuple(film_cast[int(i)] for i in rng.choice(len(film_cast), n_chars, replace=False))
        plans.append(_plan_shot(rng, start, length, level, scene, cast, width, height, pan_direction))
        start += length
    return plans


def _caption_for(plan: _ShotPlan, film_id: str, fps: int) -> Caption:
    """The caption record of one shot, derived from its level, scene and cast."""
    motion, adverb = LEVEL_VOCABULARY[plan.level - 1]
    return Caption(
        film=film_id,
        start=round(plan.start_frame / fps, 6),
        end=round((plan.start_frame + plan.num_frames) / fps, 6),
        character=CHARACTER_JOINER.join(member.name for member in plan.cast),
        motion=motion,
        adverb=adverb,
        environment=plan.setting.environment,
        time_of_day=plan.setting.time_of_day,
        sc=int(len(plan.cast) > 1),
        et=int(plan.setting.leisure),
        st=-1 if plan.level >= TIRING_LEVEL else 1,
    )


def _shot_truth(index: int, plan: _ShotPlan, film_id: str, fps: int) -> Shot:
    return Shot(
        index=index,
        start_frame=plan.start_frame,
        end_frame=plan.start_frame + plan.num_frames,
        speed_px_per_frame=plan.speed,
        level=plan.level,
        characters=tuple(member.name for member in plan.cast),
        environment=plan.setting.environment,
        time_of_day=plan.setting.time_of_day,
        pan_direction=plan.pan_direction,
        caption=_caption_for(plan, film_id, fps),
    )


# =========================================================================== background
def _smooth_noise(rng: np.random.Generator, shape: tuple[int, int], scale: float) -> np.ndarray:
    """Unit-std noise with blobs at a few sizes: rich in gradients (for optical flow) yet smooth
    enough that even the fastest pan changes few pixel values between frames (no false cuts)."""
    total = np.zeros(shape, dtype=np.float32)
    for sigma in TEXTURE_SIGMAS_AT_REFERENCE:
        white = rng.standard_normal(shape).astype(np.float32)
        layer = cv2.GaussianBlur(white, (0, 0), sigma * scale)
        total += layer / (layer.std() + 1e-6)
    return total / (total.std() + 1e-6)


def _tone_pair(hsv: HSV) -> tuple[np.ndarray, np.ndarray]:
    """Dark and light BGR tones of one band colour; the texture blends between them."""
    hue, sat, val = hsv
    dark = (hue, min(255, sat + TONE_SATURATION_SPREAD // 2), max(0, val - TONE_VALUE_SPREAD // 2))
    light = (hue, max(0, sat - TONE_SATURATION_SPREAD // 2), min(255, val + TONE_VALUE_SPREAD // 2))
    return _hsv_to_bgr(dark), _hsv_to_bgr(light)


def _background_canvas(plan: _ShotPlan, width: int, height: int) -> np.ndarray:
    """The shot's textured backdrop, wide enough for the whole pan (sky above, ground below)."""
    pan_length = plan.speed * (plan.num_frames - 1)
    canvas_width = width + int(math.ceil(pan_length)) + 2 * PAN_MARGIN_PX
    rng = np.random.default_rng(plan.noise_seed)
    noise = _smooth_noise(rng, (height, canvas_width), width / REFERENCE_WIDTH)
    blend = np.clip(0.5 + TEXTURE_GAIN * noise, 0.0, 1.0)[..., None]

    rows = np.arange(height, dtype=np.float32)[:, None, None]
    is_sky = rows < plan.horizon_y
    sky_dark, sky_light = _tone_pair(plan.sky_hsv)
    ground_dark, ground_light = _tone_pair(plan.ground_hsv)
    dark = np.where(is_sky, sky_dark, ground_dark)
    light = np.where(is_sky, sky_light, ground_light)
    canvas = dark + blend * (light - dark)
    # Sky brightens towards the horizon: a cartoon gradient that a horizontal pan leaves unchanged.
    sky_ramp = SKY_GRADIENT_VALUE * np.clip(rows / plan.horizon_y, 0.0, 1.0)
    canvas += np.where(is_sky, sky_ramp, 0.0)
    return np.clip(canvas, 0, 255).astype(np.uint8)


def _pan_offsets(plan: _ShotPlan) -> np.ndarray:
    """Canvas x of the frame's left edge per frame: moves at ``speed`` against the pan."""
    t = np.arange(plan.num_frames, dtype=np.float64)
    travel = plan.speed * (plan.num_frames - 1)
    if plan.pan_direction > 0:  # content flows right: the window slides left over the canvas
        return PAN_MARGIN_PX + travel - plan.speed * t
    return PAN_MARGIN_PX + plan.speed * t


def _crop(canvas: np.ndarray, offset_x: float, width: int) -> np.ndarray:
    """Sub-pixel horizontal window of the canvas (linear blend of the two nearest integer
    windows), so slow pans move smoothly; cheaper than a general warp."""
    left = int(math.floor(offset_x))
    frac = offset_x - left
    window = canvas[:, left : left + width]
    if frac == 0.0:
        return window.copy()
    next_window = canvas[:, left + 1 : left + 1 + width]
    return cv2.addWeighted(window, 1.0 - frac, next_window, frac, 0.0)


# =========================================================================== characters
def _fixed(value: float) -> int:
    """A coordinate in cv2's fixed-point drawing units (see ``SUBPIXEL_BITS``)."""
    return int(round(value * (1 << SUBPIXEL_BITS)))


def _ellipse(
    img: np.ndarray, center: tuple[float, float], axes: tuple[float, float], bgr: Color,
    outline: bool = True,
) -> None:
    """Filled, anti-aliased, sub-pixel ellipse with an optional cartoon outline."""
    center_fixed = (_fixed(center[0]), _fixed(center[1]))
    axes_fixed = (_fixed(axes[0]), _fixed(axes[1]))
    cv2.ellipse(img, center_fixed, axes_fixed, 0, 0, 360, bgr, -1, cv2.LINE_AA, SUBPIXEL_BITS)
    if outline:
        cv2.ellipse(img, center_fixed, axes_fixed, 0, 0, 360, OUTLINE_BGR, OUTLINE_PX,
                    cv2.LINE_AA, SUBPIXEL_BITS)


def _polygon(img: np.ndarray, points: Sequence[tuple[float, float]], bgr: Color) -> None:
    """Filled, anti-aliased, sub-pixel convex polygon with a cartoon outline."""
    pts = np.array([[_fixed(x), _fixed(y)] for x, y in points], dtype=np.int32)
    cv2.fillConvexPoly(img, pts, bgr, cv2.LINE_AA, SUBPIXEL_BITS)
    cv2.polylines(img, [pts], True, OUTLINE_BGR, OUTLINE_PX, cv2.LINE_AA, SUBPIXEL_BITS)


def _draw_ears(img: np.ndarray, ears: str, hx: float, hy: float, r: float, bgr: Color) -> None:
    """The ear shape is what tells characters apart besides colour."""
    for side in (-1, 1):
        ex = hx + side * 0.6 * r
        if ears == "round":
            _ellipse(img, (ex, hy - 0.85 * r), (0.35 * r, 0.35 * r), bgr)
        elif ears == "long":
            _ellipse(img, (ex, hy - 1.2 * r), (0.22 * r, 0.6 * r), bgr)
        else:  # pointy
            tip = (ex + side * 0.15 * r, hy - 1.45 * r)
            _polygon(img, [(ex - 0.35 * r, hy - 0.6 * r), (ex + 0.35 * r, hy - 0.6 * r), tip], bgr)


def _draw_character(
    img: np.ndarray, member: CastMember, x: float, feet_y: float, height: int, facing: int
) -> None:
    """Feet + body + belly + ears + head + eyes looking the way the character goes.

    Rigid (no limb animation), so its optical flow equals its on-screen velocity. The literal
    fractions are shape proportions relative to the body (w, h) or the head radius (r).
    """
    w = _character_width(height)
    h = CHARACTER_HEIGHT_FRACTION * BODY_HEIGHT_FRACTION * height
    r = 0.42 * w
    body = tuple(float(c) for c in _hsv_to_bgr(member.body_hsv))
    belly = tuple(min(255.0, 0.5 * c + 128.0) for c in body)  # paler
    feet = tuple(0.55 * c for c in body)  # darker

    for side in (-1, 1):
        _ellipse(img, (x + side * 0.25 * w, feet_y - 0.04 * h), (0.2 * w, 0.1 * h), feet)
    body_y = feet_y - h / 2
    _ellipse(img, (x, body_y), (w / 2, h / 2), body)
    _ellipse(img, (x + facing * 0.06 * w, body_y + 0.1 * h), (0.3 * w, 0.3 * h), belly, False)
    head_y = feet_y - h - 0.7 * r
    _draw_ears(img, member.ears, x, head_y, r, body)
    _ellipse(img, (x, head_y), (r, r), body)
    for side in (-1, 1):
        eye_x = x + side * 0.38 * r + facing * 0.12 * r
        _ellipse(img, (eye_x, head_y - 0.1 * r), (0.22 * r, 0.26 * r), EYE_WHITE_BGR, False)
        pupil = (eye_x + facing * 0.09 * r, head_y - 0.05 * r)
        _ellipse(img, pupil, (0.11 * r, 0.13 * r), OUTLINE_BGR, False)


def _bounce(
    start: float, velocity: float, t: np.ndarray, low: float, high: float
) -> tuple[np.ndarray, np.ndarray]:
    """Positions and headings of a point moving at constant speed, reflected at [low, high]:
    the speed never changes, so the shot's motion level holds for every frame."""
    span = high - low
    phase = np.mod(start - low + velocity * t, 2 * span)
    forward = phase < span
    position = low + np.where(forward, phase, 2 * span - phase)
    heading = np.where(forward, 1, -1) * (1 if velocity >= 0 else -1)
    return position, heading


def _character_tracks(
    plan: _ShotPlan, width: int, height: int
) -> list[tuple[np.ndarray, np.ndarray, float]]:
    """Per character: x per frame, facing per frame, and the y of its feet."""
    margin = _walk_margin(height)
    t = np.arange(plan.num_frames, dtype=np.float64)
    tracks = []
    for i, (x0, direction) in enumerate(zip(plan.start_x, plan.walk_direction)):
        xs, facing = _bounce(x0, direction * plan.speed, t, margin, width - margin)
        if plan.speed == 0:
            facing = np.full_like(facing, direction)
        # The second character stands a little nearer the camera, so they overlap cleanly.
        feet_y = plan.horizon_y + (FEET_BELOW_HORIZON + SECOND_ROW_STEP * i) * height
        tracks.append((xs, facing, feet_y))
    return tracks


# =========================================================================== rendering + encoding
def _render_shot(plan: _ShotPlan, width: int, height: int) -> Iterator[np.ndarray]:
    """Yield the shot's BGR frames."""
    canvas = _background_canvas(plan, width, height)
    offsets = _pan_offsets(plan)
    tracks = _character_tracks(plan, width, height)
    for index in range(plan.num_frames):
        frame = _crop(canvas, float(offsets[index]), width)
        for member, (xs, facing, feet_y) in zip(plan.cast, tracks):
            _draw_character(frame, member, float(xs[index]), feet_y, height, int(facing[index]))
        yield frame


def _encode(frames: Iterator[np.ndarray], path: Path, width: int, height: int, fps: int) -> int:
    """Write frames as constant-frame-rate H.264 yuv420p mp4; return the number written."""
    import av  # the encoder's libraries load when a film is drawn, not with the pipeline's every command

    count = 0
    with av.open(str(path), mode="w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=Fraction(fps), options=dict(X264_OPTIONS))
        stream.width = width
        stream.height = height
        stream.pix_fmt = "yuv420p"
        stream.codec_context.gop_size = KEYFRAME_INTERVAL_SECONDS * fps
        stream.codec_context.time_base = Fraction(1, fps)
        stream.thread_count = 1
        for frame_bgr in frames:
            # BT.601 limited range, the same as swscale's default, and fast.
            yuv = cv2.cvtColor(frame_bgr, cv2.COLOR_BGR2YUV_I420)
            frame = av.VideoFrame.from_ndarray(yuv, format="yuv420p")
            frame.pts = count
            frame.time_base = Fraction(1, fps)
            container.mux(stream.encode(frame))
            count += 1
        container.mux(stream.encode(None))
    return count


def _write_captions(path: Path, captions: Sequence[Caption]) -> None:
    lines = [json.dumps(c.to_record(), ensure_ascii=False) for c in captions]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def make_toy_film(
    out_dir: str | Path,
    film_id: str = "toyfilm",
    seed: int = 0,
    width: int = 480,
    height: int = 272,
    fps: int = 24,
    variant: int = 0,
    pan_direction: int = 0,
) -> ToyFilm:
    """Draw, encode and describe a toy film; deterministic in all arguments.

    ``seed`` varies shot lengths, level order, texture and positions; ``variant`` additionally
    brings another cast (the variant's group of three characters, see ``_cast_groups``), another
    scene selection/order and shifted palettes, for "new film" tests and the known-answer data set.
    ``pan_direction`` 0 draws each moving shot's pan left or right; +1 (the frame moves right over the
    scene) or -1 fixes it for every shot, and nothing else changes. Width and height must be even (yuv420p).
    """
    if width % 2 or height % 2:
        raise ValueError(f"width and height must be even for yuv420p, got {width}x{height}")
    if pan_direction not in (-1, 0, 1):
        raise ValueError(f"pan_direction must be -1, 0 or 1, got {pan_direction}")
    started = time.perf_counter()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    plans = _plan_shots(seed, variant, width, height, fps, pan_direction)
    film = ToyFilm(
        film_id=film_id,
        seed=seed,
        variant=variant,
        fps=fps,
        width=width,
        height=height,
        num_frames=sum(plan.num_frames for plan in plans),
        shots=tuple(_shot_truth(i, plan, film_id, fps) for i, plan in enumerate(plans)),
        video_path=out / f"{film_id}.mp4",
        captions_path=out / f"{film_id}.captions.jsonl",
        truth_path=out / f"{film_id}.truth.json",
        pan_direction=pan_direction,
    )
    frames = (frame for plan in plans for frame in _render_shot(plan, width, height))
    written = _encode(frames, film.video_path, width, height, fps)
    if written != film.num_frames:
        raise RuntimeError(f"wrote {written} frames, planned {film.num_frames}")
    _write_captions(film.captions_path, film.captions)
    film.truth_path.write_text(json.dumps(film.to_json(), indent=2) + "\n", encoding="utf-8")
    logger.info(
        "toy film %s: %d shots, %d frames (%.1f s) in %.2f s -> %s",
        film_id, len(film.shots), film.num_frames, film.duration,
        time.perf_counter() - started, film.video_path,
    )
    return film


# =========================================================================== CLI
def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m data_pipeline.toyfilm",
        description="Draw a cartoon toy film (mp4 + captions JSONL + ground-truth JSON).",
    )
    parser.add_argument("out_dir", type=Path, help="folder to write the three files into")
    parser.add_argument("--film-id", default="toyfilm", help="base name of the files")
    parser.add_argument("--seed", type=int, default=0, help="randomness of lengths/levels/texture")
    parser.add_argument("--variant", type=int, default=0, help="another cast, scenes and palettes")
    parser.add_argument("--width", type=int, default=480)
    parser.add_argument("--height", type=int, default=272)
    parser.add_argument("--fps", type=int, default=24)
    return parser.parse_args(argv)


MIN_SIDE = 16  # pixels: the smallest frame side the command draws into


def option_problems(args: argparse.Namespace) -> list[str]:
    """The command's options that would stop the drawing: each named with what it must be."""
    problems = [f"--{name} {value}: must be an even number of pixels, at least {MIN_SIDE}"
                for name, value in (("width", args.width), ("height", args.height))
                if value < MIN_SIDE or value % 2]
    problems += [] if args.fps >= 1 else [f"--fps {args.fps}: must be at least 1"]
    problems += seed_problems(f"--seed {args.seed}:", args.seed)
    problems += [] if args.variant >= 0 else [f"--variant {args.variant}: must be 0 or more"]
    return problems


@exit_on_user_error
def main(argv: Sequence[str] | None = None) -> int:
    args = _parse_args(argv)
    setup_logging("INFO")
    if problems := option_problems(args):
        raise UserError("; ".join(problems))
    film = make_toy_film(
        args.out_dir, film_id=args.film_id, seed=args.seed, width=args.width,
        height=args.height, fps=args.fps, variant=args.variant,
    )
    print(f"video:    {film.video_path}")
    print(f"captions: {film.captions_path}")
    print(f"truth:    {film.truth_path}")
    for shot in film.shots:
        c = shot.caption
        print(
            f"  shot {shot.index:2d}  frames {shot.start_frame:5d}-{shot.end_frame:5d}  "
            f"level {shot.level}  {shot.speed_px_per_frame:5.2f} px/frame  "
            f"{' & '.join(shot.characters)} {c.motion} {c.adverb} "
            f"in the {c.environment} ({c.time_of_day})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
