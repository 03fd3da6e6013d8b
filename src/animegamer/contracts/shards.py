"""What the samples of each shard folder hold (see docs/architecture.md, 'Shard contracts'): the member
names the pipeline writes and every reader reads, the fields of each json record, and the key a reader adds
for the samples it skipped."""
from __future__ import annotations

from animegamer.contracts.states import CHARACTER_STATES, STATE_KEYS

JSON = "json"  # every sample's record
MP4 = "mp4"  # clip shards: the clip
NPY_SUFFIX = ".npy"  # arrays, read with allow_pickle=False
LATENTS = "latents.npy"  # feature and adaptation shards: VAE latents (T', C, H', W')
TEXT = "text.npy"  # feature shards: T5's hidden states of the motion text (L_text, text_dim)
IMAGE = "image.npy"  # feature shards: CLIP's patch tokens of the first frame (P, image_dim)
REP = "rep.npy"  # representation shards: the encoder's output (N, D)
REPS = "reps.npy"  # session shards: each turn's representation (K, N, D)
PRED_REP = "pred_rep.npy"  # adaptation shards: the frozen MLLM's prediction (N, D)
SKIPPED = "__skipped__"  # an item's (and a batch's) records of the samples skipped as unreadable

# --------------------------------------------------------------------------- the json records
# Each record's field names, spelt once here: the pipeline writes them, every reader reads them. The
# forms below give each record's fields with their json types (a nested record is a dict of its own
# fields, a list of one form a list of such values, a tuple the forms a value may take, NULL where a
# failed caption leaves a field empty); no record holds a field its form does not name.
NULL = type(None)

# Clip shards (and the feature and representation shards, which carry each clip's record).
KEY = "key"  # the clip's sample key, {film}-{clip:06d}
FILM = "film"
SHOT = "shot"  # the shot's index in its film
CLIP = "clip"  # the clip's running index over its film
# The film's file name: its path is the manifest's (``sources``, by film id), so clips cut from films that
# moved are the same bytes and whatever trained on them resumes.
SOURCE = "source"
SOURCE_FRAMES = "source_frames"  # the film's frame index of each clip frame
START, END = "start", "end"  # seconds into the film
FPS, FRAMES, HEIGHT, WIDTH = "fps", "frames", "height", "width"
MOTION = "motion"  # {FLOW, LEVEL}
FLOW = "flow"  # mean optical-flow magnitude, output pixels per frame
LEVEL = "level"  # the motion level the flow falls in, 1..NUM_MOTION_LEVELS
CAPTION = "caption"  # {each of CAPTION_FIELDS}
CAPTION_FIELDS: tuple[str, ...] = ("character", "motion", "adverb", "environment", "time_of_day")
STATES = "states"  # contracts.states' keys: a clip's CHARACTER_STATES, a session turn's STATE_KEYS
INSTRUCTION = "instruction"  # Character: ...; Motion: ...; Background: ... (what the MLLM reads)
MOTION_TEXT = "motion_text"  # {adverb} {motion} (what T5 reads)
CAPTIONER = "captioner"  # {NAME, VERSION, STATUS, ERROR, ATTEMPTS}
NAME, VERSION, STATUS, ERROR, ATTEMPTS = "name", "version", "status", "error", "attempts"

# Session shards: one record per session; each turn as phase (b) reads it.
KEYS = "keys"  # the session's clip keys, in order
TURNS = "turns"  # [{KEY, INSTRUCTION, FLOW, STATES}]

# Adaptation shards: the clip's key, flow and level, and how many true turns preceded its prediction.
HISTORY_TURNS = "history_turns"

CLIP_RECORD: dict = {
    KEY: str, FILM: str, SHOT: int, CLIP: int, SOURCE: str, SOURCE_FRAMES: [int], START: float, END: float,
    FPS: float, FRAMES: int, HEIGHT: int, WIDTH: int,
    MOTION: {FLOW: float, LEVEL: int},
    CAPTION: ({slot: str for slot in CAPTION_FIELDS}, NULL),
    STATES: ({state: int for state in CHARACTER_STATES}, NULL),
    INSTRUCTION: (str, NULL),
    MOTION_TEXT: (str, NULL),
    CAPTIONER: {NAME: str, VERSION: str, STATUS: str, ERROR: str, ATTEMPTS: int},
}
SESSION_TURN: dict = {KEY: str, INSTRUCTION: str, FLOW: float, STATES: {state: int for state in STATE_KEYS}}
SESSION_RECORD: dict = {FILM: str, KEYS: [str], TURNS: [SESSION_TURN]}
ADAPTATION_RECORD: dict = {KEY: str, FLOW: float, LEVEL: int, HISTORY_TURNS: int}
