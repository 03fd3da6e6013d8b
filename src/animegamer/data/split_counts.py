"""What a pipeline output folder holds under one held-out fraction: its clips, captioned clips, shots,
the clips on each side of the split, the longest run of training clips and the sessions on each side.
Read from the files the pipeline writes (the clip shards' json, ``shots.json``, ``sessions.json``) with
the held-out rule of :mod:`animegamer.data.split`; the recipes' pre-flight and the known-answer data
set's measurements read them."""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from animegamer.config.validate import ConfigError
from animegamer.contracts.files import MANIFEST, SESSIONS_FILE
from animegamer.contracts.shards import CAPTIONER, JSON, KEY, STATUS
from animegamer.data.indexed import IndexedShardDataset, key_fraction
from animegamer.data.split import TRAIN, VAL, HeldOut, consecutive_runs, session_key
from animegamer.data.storage import ShardSource, join
from animegamer.media.captions import STATUS_OK
from animegamer.utils.io import sha256_bytes


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
    clips = IndexedShardDataset(folder, _json_of, video=False, allow_empty=True, members=(JSON,))
    return tuple(clips[i] for i in range(len(clips)))


def _json_of(sample: dict) -> dict:
    return sample[JSON]


def read_clips(root: str | Path, clips_dir: str, val_fraction: float):
    """(shard folder, every clip's json, the split, the captioned clips' json) of a pipeline output."""
    folder = ShardSource(join(root, clips_dir))  # a folder or a URL
    problem = folder.manifest_problem()
    if problem is not None:
        raise ConfigError([problem if folder.remote else f"{problem}; the pipeline has not written clip shards there"])
    metas = _clip_metas(folder.folder, sha256_bytes(folder.read_bytes(MANIFEST)))
    captioned = [m for m in metas if m[CAPTIONER][STATUS] == STATUS_OK]
    return folder, metas, HeldOut(root, clips_dir, val_fraction), captioned


def split_counts(root: str | Path, clips_dir: str, val_fraction: float) -> SplitCounts:
    """Counts of the pipeline output at ``root`` under the held-out split at ``val_fraction``."""
    folder, metas, split, captioned = read_clips(root, clips_dir, val_fraction)
    shots = {split.unit(m[KEY]): key_fraction(split.unit(m[KEY])) for m in captioned}
    held = [split.clip(m[KEY]) for m in captioned]
    runs = consecutive_runs(captioned, lambda m: not split.clip(m[KEY]))
    sessions = ShardSource(str(root)).read_json_if_exists(SESSIONS_FILE) or {"turns": 0, "sessions": []}
    keys = [session_key(s["keys"]) for s in sessions["sessions"]]
    return SplitCounts(
        folder=str(folder), val_fraction=val_fraction, clips=len(metas), captioned=len(captioned), shots=shots,
        train_clips=held.count(False), held_out_clips=held.count(True),
        longest_train_run=max((len(r) for r in runs), default=0), turns=int(sessions["turns"]),
        train_sessions=sum(map(split.keep_session(TRAIN), keys)),
        held_out_sessions=sum(map(split.keep_session(VAL), keys)))
