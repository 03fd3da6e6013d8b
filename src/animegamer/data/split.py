"""The held-out split, shared by every phase and by evaluation: whole shots are held out.

A clip is held out when its shot is (a stable hash of ``film/shot`` below ``data.val_fraction``),
so no phase trains on any clip of a held-out shot and evaluation games are made of shots never
trained on. The pipeline writes ``shots.json`` (clip key -> shot id) beside the clip shards; data
without it (e.g. synthetic test shards) is split by key instead. A session is held out when all of
its clips are, trains when none is, and is used for neither when it mixes both.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterable

from animegamer.contracts.files import SESSIONS_FILE, SHOTS_FILE
from animegamer.contracts.shards import CLIP, FILM
from animegamer.data.indexed import key_fraction
from animegamer.data.storage import RemoteSettings, ShardSource, join, remote_settings

VAL, TRAIN = "val", "train"


def shot_id(film: str, shot: int) -> str:
    return f"{film}/shot-{shot:05d}"


def session_key(keys: list[str]) -> str:
    """The session-shard sample key of a session (its first clip and its length)."""
    return f"{keys[0]}-s{len(keys)}"


class HeldOut:
    def __init__(self, data_root: str | Path, clips_dir: str, fraction: float,
                 remote: RemoteSettings = RemoteSettings()) -> None:
        # data_root may be a URL (read with the ``remote`` retry settings, see animegamer.data.storage).
        self.shot_of: dict[str, str] | None = ShardSource(join(data_root, clips_dir), remote).read_json_if_exists(
            SHOTS_FILE)
        index = ShardSource(str(data_root), remote).read_json_if_exists(SESSIONS_FILE)
        self.session_keys: dict[str, list[str]] = (
            {session_key(s["keys"]): s["keys"] for s in index["sessions"]} if index is not None else {})
        self.fraction = fraction

    def unit(self, key: str) -> str:
        """What a clip is held out with: its shot, or the clip itself where there is no shots.json."""
        return self.shot_of.get(key, key) if self.shot_of is not None else key

    def clip(self, key: str) -> bool:
        return key_fraction(self.unit(key)) < self.fraction

    def keep_clip(self, split: str) -> Callable[[str], bool]:
        return lambda key: self.clip(key) == (split == VAL)

    def keep_session(self, split: str) -> Callable[[str], bool]:
        def keep(key: str) -> bool:
            clips = self.session_keys.get(key)
            if clips is None or self.shot_of is None:  # no index: split by the session's own key
                return (key_fraction(key) < self.fraction) == (split == VAL)
            held = [self.clip(k) for k in clips]
            return all(held) if split == VAL else not any(held)
        return keep


def held_out(cfg) -> HeldOut:
    return HeldOut(cfg.data.root, cfg.data.clips, cfg.data.val_fraction, remote_settings(cfg.data))


def consecutive_runs(metas: Iterable[dict], keep: Callable[[dict], bool]) -> list[list[dict]]:
    """Runs of consecutive clips (same film, adjacent clip numbers) that all pass ``keep``."""
    runs: list[list[dict]] = []
    for meta in sorted(metas, key=lambda m: (m[FILM], m[CLIP])):
        if not keep(meta):
            continue
        last = runs[-1][-1] if runs else None
        if last is not None and last[FILM] == meta[FILM] and last[CLIP] + 1 == meta[CLIP]:
            runs[-1].append(meta)
        else:
            runs.append([meta])
    return runs
