"""Fine-tuning the quick start's game on a second film, and the finetune command's refusals before it
trains (apart from tests/test_quickstart.py, so that CI's two workers share the quick start's tests)."""
from __future__ import annotations

import pytest

from animegamer.data.shards import read_manifest
from animegamer.errors import UserError
from animegamer.finetune import main as finetune
from data_pipeline.toyfilm import make_toy_film


def test_finetune_on_a_second_film_from_the_quickstart(quickstart, tmp_path):
    """Into a folder whose name Hydra's grammar would read otherwise unquoted: every stage gets it as it is."""
    root, _ = quickstart
    film = make_toy_film(tmp_path / "film_b", film_id="second_film", variant=1)
    out = tmp_path / "Howl's fine-tune, [2]"
    # Two steps a phase, two sampling steps and one reconstructed clip: every stage still runs and writes its
    # outputs, which is what is read here.
    summary = finetune(["--film", str(film.video_path), "--captions", str(film.captions_path), "--from", str(root),
                        "--out", str(out), "--steps", "2", "2", "2", "--constrained-states",
                        "model.diffusion.sampling_steps=2", "evaluation.reconstruction_clips=1"])
    assert summary["phase a start"] == str(root / "a_joint" / "export")  # no warm-up: starts from the old export
    clips = read_manifest(summary["clip shards"])
    # Cut at the size the quick start's exports were trained at (96x144), not the tiny preset's 480x720.
    trained = read_manifest(root / "pipeline" / "clips")["config"]["pipeline"]["clips"]
    assert {k: clips["config"]["pipeline"]["clips"][k] for k in ("frames", "height", "width", "fps")} == \
        {k: trained[k] for k in ("frames", "height", "width", "fps")} == {"frames": 17, "height": 96, "width": 144, "fps": 8.0}
    assert clips["sources"][0]["film_id"] == "second_film" and clips["counts"]["clips"] > 0
    for phase in ("a_joint", "b", "c"):
        assert (out / phase / "export" / "trained.safetensors").exists()
    assert (out / "eval" / "report.md").exists() and (out / "game" / "index.html").exists()


def test_finetune_refuses_a_preset_the_exports_do_not_fit(quickstart, tmp_path):
    """The quick start's exports are the tiny preset's: ``--model paper`` stops before the pipeline runs."""
    root, _ = quickstart
    with pytest.raises(UserError, match="trained with model=tiny"):
        finetune(["--film", str(tmp_path / "none.mp4"), "--captions", str(tmp_path / "c.jsonl"), "--from", str(root),
                  "--out", str(tmp_path / "ft"), "--model", "paper"])
    assert not (tmp_path / "ft").exists()


def test_finetune_refuses_a_misspelt_option_rather_than_passing_it_to_hydra(capsys):
    with pytest.raises(SystemExit) as stopped:
        finetune(["--film", "f", "--captions", "c", "--from", "r", "--out", "o", "--stpes", "5", "5", "5"])
    assert stopped.value.code == 2 and "unrecognized arguments: --stpes" in capsys.readouterr().err
