"""The json records the pipeline's steps write (clip, session and adaptation shards, at the quick start's
tiny model size) hold exactly the fields ``animegamer.contracts.shards`` names, each with its type."""
from __future__ import annotations

import json

import numpy as np
import pytest
from omegaconf import OmegaConf

from animegamer.checkpoints.export import save_export
from animegamer.config.compose import compose_config
from animegamer.contracts import shards as contract
from animegamer.contracts.exports import PHASE_B
from animegamer.contracts.files import (ADAPTATION_DIR, CLIPS_DIR, FEATURES_DIR, MANIFEST, REPRESENTATIONS_DIR,
                                        SESSION_SHARDS_DIR, SESSIONS_FILE)
from animegamer.contracts.shards import JSON, LATENTS, REP
from animegamer.data.indexed import IndexedShardDataset
from animegamer.media.captions import STATUS_FAILED
from animegamer.media.motion_bins import compute_bins
from animegamer.models.encoder import representation_tokens
from animegamer.models.game_mllm import build_game_mllm
from animegamer.utils.io import npy_bytes
from data_pipeline.adaptation import build_adaptation_shards
from data_pipeline.captioners.base import CaptionResult
from data_pipeline.captioners.fields import Caption, States
from data_pipeline.clips import ClipWindow
from data_pipeline.ingest import FilmInfo
from data_pipeline.process import caption_fields, clip_meta
from data_pipeline.session_shards import build_session_shards
from data_pipeline.writer import with_levels, write_numbered_shards, write_shards

FILM = FilmInfo("toyfilm", "/films/toyfilm.mp4", 1, "0" * 64, 24.0, 480, 96, 64)
CLIPS = 6  # one session of SESSION_TURNS turns, then a clip whose caption failed
SESSION_TURNS = 5
LATENT_SHAPE = (2, 4, 4, 6)  # any (T', C, H', W'): the adaptation step copies the latents as they are


def form_problems(value, form, where: str) -> list[str]:
    """Where ``value`` departs from ``form`` (contracts.shards' record forms): a missing or unnamed field,
    or a value of another type."""
    if isinstance(form, tuple):  # one of several forms
        tries = [form_problems(value, one, where) for one in form]
        return [] if any(not found for found in tries) else min(tries, key=len)
    if isinstance(form, dict):
        if not isinstance(value, dict):
            return [f"{where}: {type(value).__name__}, not a record"]
        problems = [f"{where}.{name}: missing" for name in form if name not in value]
        problems += [f"{where}.{name}: not named by the contract" for name in value if name not in form]
        return problems + [p for name in form if name in value for p in form_problems(value[name], form[name],
                                                                                       f"{where}.{name}")]
    if isinstance(form, list):
        if not isinstance(value, list):
            return [f"{where}: {type(value).__name__}, not a list"]
        return [p for i, item in enumerate(value) for p in form_problems(item, form[0], f"{where}[{i}]")]
    if isinstance(value, bool) or not isinstance(value, form):
        return [f"{where}: {type(value).__name__} {value!r}, not {form.__name__}"]
    return []


def _records(folder) -> list[dict]:
    shards = IndexedShardDataset(folder, lambda sample: sample[JSON], video=False)
    return [shards[i] for i in range(len(shards))]


def _manifest(folder, kind: str, shards: list[dict]) -> None:
    (folder / MANIFEST).write_text(json.dumps({"kind": kind, "shards": shards}))


def _caption(index: int) -> CaptionResult:
    if index == CLIPS - 1:
        return CaptionResult.failure("no caption record covers the clip", "jsonl", "v1", attempts=1)
    caption = Caption("Qiqi", "walk", "slowly", "forest", "night")
    return CaptionResult.success(caption, States(SC=index % 2, ET=1, ST=-1), "jsonl", "v1")


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """Clip shards from the process and finalize steps' record builders and writer, then the session and
    adaptation steps on them (a tiny phase (b) export predicts)."""
    root = tmp_path_factory.mktemp("contract")
    cfg = OmegaConf.to_object(compose_config("pipeline", [f"pipeline.output={root}", "pipeline.writer.maxcount=4",
                                                          "pipeline.adaptation.device=cpu"]))
    clips = []
    for index in range(CLIPS):
        window = ClipWindow(FILM.film_id, index, index // 3, tuple(range(index * 17, index * 17 + 17)))
        mp4 = root / f"{window.key}.mp4"
        mp4.write_bytes(b"not read: the records are checked")
        clips.append((window.key, mp4, {**clip_meta(FILM, window, cfg.pipeline, 1.5 * index),
                                        **caption_fields(_caption(index))}))
    bins = compute_bins([meta[contract.MOTION][contract.FLOW] for _, _, meta in clips], cfg.pipeline.motion)
    clips = with_levels(clips, bins)
    _manifest(root / CLIPS_DIR, "clips", write_shards(clips, root / CLIPS_DIR, cfg.pipeline.writer.maxcount))

    # What the representations and precompute steps add to each captioned clip's record.
    rng = np.random.default_rng(0)
    captioned = [meta for _, _, meta in clips[:SESSION_TURNS]]
    rep_shape = (representation_tokens(cfg.model.encoder), cfg.model.encoder.width)
    for folder, member, shape in ((REPRESENTATIONS_DIR, REP, rep_shape), (FEATURES_DIR, LATENTS, LATENT_SHAPE)):
        entries = write_numbered_shards(captioned, root / folder, cfg.pipeline.writer.maxcount, lambda group: (
            {"__key__": m[contract.KEY], JSON: json.dumps(m).encode(),
             member: npy_bytes(rng.standard_normal(shape).astype(np.float16))} for m in group), folder)
        _manifest(root / folder, folder, entries)
    (root / SESSIONS_FILE).write_text(json.dumps({"sessions": [
        {"film": FILM.film_id, "keys": [m[contract.KEY] for m in captioned],
         "levels": [m[contract.MOTION][contract.LEVEL] for m in captioned]}]}))
    build_session_shards(cfg.pipeline, {})

    export = save_export(root / "export_b", build_game_mllm(cfg).model, {"phase": PHASE_B})
    cfg.pipeline.adaptation.export = str(export)
    build_adaptation_shards(cfg.pipeline, cfg.model, {})
    return root


def test_clip_records_hold_the_contracts_fields(written):
    records = _records(written / CLIPS_DIR)
    assert len(records) == CLIPS
    assert [r[contract.CAPTIONER][contract.STATUS] for r in records].count(STATUS_FAILED) == 1
    assert records[-1][contract.CAPTION] is None and records[0][contract.CAPTION] is not None
    problems = [p for r in records for p in form_problems(r, contract.CLIP_RECORD, r[contract.KEY])]
    assert problems == []


def test_session_records_hold_the_contracts_fields(written):
    (record,) = _records(written / SESSION_SHARDS_DIR)
    assert len(record[contract.TURNS]) == SESSION_TURNS
    assert form_problems(record, contract.SESSION_RECORD, "session") == []


def test_adaptation_records_hold_the_contracts_fields(written):
    records = _records(written / ADAPTATION_DIR)
    assert [r[contract.HISTORY_TURNS] for r in records] == list(range(SESSION_TURNS))
    problems = [p for r in records for p in form_problems(r, contract.ADAPTATION_RECORD, r[contract.KEY])]
    assert problems == []


def test_the_check_names_a_missing_an_unnamed_and_a_mistyped_field():
    record = {contract.KEY: "film-000000", contract.FLOW: "1.5", contract.LEVEL: 2, "extra": 1}
    assert form_problems(record, contract.ADAPTATION_RECORD, "r") == [
        f"r.{contract.HISTORY_TURNS}: missing", "r.extra: not named by the contract",
        f"r.{contract.FLOW}: str '1.5', not float"]
    assert form_problems({contract.CAPTION: None}, {contract.CAPTION: ({"a": str}, contract.NULL)}, "r") == []
    assert form_problems([1, "2"], [int], "r") == ["r[1]: str '2', not int"]
