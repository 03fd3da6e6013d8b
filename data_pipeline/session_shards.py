"""Session shards (phase b input): the session index joined with the representation shards.

One sample per session: ``json`` with each turn's key, instruction, motion level, flow and states,
and ``reps.npy`` (K, N, D). The manifest records the hashes of both sources, so a session set built
from another representation export is detected, not silently used; a re-run from the same sources
reuses it.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from animegamer.config.schema import PipelineConfig
from animegamer.contracts.files import MANIFEST, REPRESENTATIONS_DIR, SESSION_SHARDS_DIR, SESSIONS_FILE
from animegamer.contracts.shards import FILM, FLOW, INSTRUCTION, JSON, KEY, KEYS, LEVEL, MOTION, REP, REPS, STATES, TURNS
from animegamer.contracts.states import CHARACTER_STATES, MOTION_LEVEL
from animegamer.data.indexed import IndexedShardDataset
from animegamer.data.split import session_key
from animegamer.utils.io import npy_bytes, read_json, sha256_file
from data_pipeline.lineage import reused_summary, step_fingerprint
from data_pipeline.writer import write_numbered_shards, write_step_manifest



def turn_record(meta: dict) -> dict:
    """What phase (b) needs of one clip: instruction and the four state values (ML = motion level)."""
    return {
        KEY: meta[KEY],
        INSTRUCTION: meta[INSTRUCTION],
        FLOW: meta[MOTION][FLOW],
        STATES: {MOTION_LEVEL: meta[MOTION][LEVEL], **{k: meta[STATES][k] for k in CHARACTER_STATES}},
    }


def build_session_shards(cfg: PipelineConfig, resolved: dict) -> dict:
    root = Path(cfg.output)
    index_path, reps_dir = root / SESSIONS_FILE, root / REPRESENTATIONS_DIR
    lineage = step_fingerprint(root, "session_shards", {"maxcount": cfg.writer.maxcount})
    reused = reused_summary(root, "session_shards", lineage[1])
    if reused is not None:
        return reused
    sessions = read_json(index_path)["sessions"]
    reps = IndexedShardDataset(reps_dir, lambda s: s, video=False)
    position = {key: i for i, key in enumerate(reps.keys())}
    missing = sorted({k for s in sessions for k in s["keys"] if k not in position})
    if missing:
        raise ValueError(f"{reps_dir}: no representation for {len(missing)} session clips, e.g. {missing[:5]}")
    def session_records(group: list[dict]):
        for session in group:
            samples = [reps.raw(position[k]) for k in session["keys"]]
            record = {FILM: session["film"], KEYS: session["keys"],
                      TURNS: [turn_record(s[JSON]) for s in samples]}
            stacked = np.stack([s[REP] for s in samples])  # (K, N, D)
            yield {"__key__": session_key(session["keys"]), JSON: json.dumps(record, sort_keys=True).encode(),
                   REPS: npy_bytes(stacked)}

    shards = write_numbered_shards(sessions, root / SESSION_SHARDS_DIR, cfg.writer.maxcount, session_records,
                                   "session shards")
    return write_step_manifest(root, "session_shards", resolved, lineage, {"sessions": len(sessions)}, shards,
                               sessions_sha256=sha256_file(index_path),
                               representations_manifest_sha256=sha256_file(reps_dir / MANIFEST))
