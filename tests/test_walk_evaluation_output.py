"""An evaluation folder holds only what its latest evaluation wrote, and an output path that cannot be a folder
is refused with its name.

A user's path: evaluate with the untrained game, the reconstruction and the motion sweep, then evaluate into
the same folder again with fewer games and none of them. The folder must not keep plots, untrained games,
held-out clips or a reconstruction report of the earlier evaluation beside a report that no longer mentions them; the earlier
ones are kept beside it (``<name>.earlier-N``), as the game folders are. An ``evaluation.out`` or a ranking
``--out`` that is a file stops the command in its pre-flight (exit code 2, no traceback).
"""
from __future__ import annotations

import pytest

from animegamer.config.compose import compose_config
from animegamer.errors import USER_ERROR_EXIT_CODE
from animegamer.evaluation import motion_sweep
from animegamer.evaluation.preflight import check_evaluation
from animegamer.evaluation.report import GALLERY_FILE, PLOT_FILES, write_report
from animegamer.evaluation.runner import GAMES_FOLDER, RECONSTRUCTION_FOLDER, TRUTH_FOLDER, UNTRAINED_FOLDER, \
    set_aside_earlier_outputs
from animegamer.metrics.common import available
from animegamer.ranking.cli import main as rank_main

STALE_PLOTS = (*PLOT_FILES.values(), motion_sweep.PLOT_FILE)


def _folder(path, files=("game.json",)):
    path.mkdir(parents=True)
    for name in files:
        (path / name).write_text(name)
    return path


def test_a_report_keeps_no_plot_it_did_not_draw(tmp_path):
    """write_report draws the plots its metrics have data for; a plot an earlier report in the folder drew
    (the motion sweep of an evaluation with evaluation.motion_sweep=true, say) is removed, not left unlinked."""
    for name in (*STALE_PLOTS, GALLERY_FILE):
        (tmp_path / name).write_bytes(b"earlier")
    files = write_report(tmp_path, {"acc_s": available(0.9), "mae_s": available(0.1)}, [])
    for name in (*STALE_PLOTS, GALLERY_FILE):
        assert not (tmp_path / name).exists(), name
    assert (tmp_path / "report.md").exists() and set(files) == {"metrics_json", "report_md"}


def _benchmark(*games: str) -> dict:
    """Games of two turns each, their clips keyed ``<game>-0`` and ``<game>-1``."""
    return {"games": [{"id": game, "turns": [{"key": f"{game}-{turn}"} for turn in range(2)]} for game in games]}


def test_what_an_evaluation_does_not_rewrite_is_set_aside(tmp_path, caplog):
    out = tmp_path / "eval"
    clips = [f"{game}-{turn}.mp4" for game in ("film-000001", "film-000002") for turn in range(2)]
    for game in ("film-000001", "film-000002"):
        _folder(out / GAMES_FOLDER / game)
        _folder(out / UNTRAINED_FOLDER / GAMES_FOLDER / game)
    _folder(out / TRUTH_FOLDER, clips)
    _folder(out / UNTRAINED_FOLDER / TRUTH_FOLDER, clips)
    _folder(out / RECONSTRUCTION_FOLDER, ("report.md", "metrics.json"))

    # The same games with the untrained game and the reconstruction: nothing to move.
    both = _benchmark("film-000001", "film-000002")
    assert set_aside_earlier_outputs(out, both, untrained=True, reconstruction=True) == []

    # One game, with the untrained game, without the reconstruction.
    moved = set_aside_earlier_outputs(out, _benchmark("film-000001"), untrained=True, reconstruction=False)
    assert sorted(p.name for p in (out / GAMES_FOLDER).iterdir()) == ["film-000001"]
    assert sorted(p.name for p in (out / UNTRAINED_FOLDER / GAMES_FOLDER).iterdir()) == ["film-000001"]
    for truth in (out / TRUTH_FOLDER, out / UNTRAINED_FOLDER / TRUTH_FOLDER):  # the clips the turns name, only
        assert sorted(p.name for p in truth.iterdir()) == clips[:2]
        assert sorted(p.name for p in truth.with_name("truth.earlier-1").iterdir()) == clips[2:]
    assert not (out / RECONSTRUCTION_FOLDER).exists()
    assert (out / "reconstruction.earlier-1" / "report.md").read_text() == "report.md"
    assert (out / "games.earlier-1" / "film-000002" / "game.json").exists()
    assert (out / UNTRAINED_FOLDER / "games.earlier-1" / "film-000002" / "game.json").exists()
    assert len(moved) == 5

    # Without the untrained game: the whole untrained folder of the earlier one goes beside it.
    moved = set_aside_earlier_outputs(out, _benchmark("film-000001"), untrained=False, reconstruction=False)
    assert moved == [out / "untrained.earlier-1"]
    assert not (out / UNTRAINED_FOLDER).exists()
    assert (out / "untrained.earlier-1" / "truth" / "film-000001-0.mp4").exists()
    assert "earlier evaluation" in caplog.text


def test_an_evaluation_out_that_is_a_file_is_refused_by_name(tmp_path):
    file = tmp_path / "film.mp4"
    file.write_bytes(b"not a folder")
    for out, where in ((file, f"{file} is a file"), (file / "eval", f"{file} is a file")):
        cfg = compose_config("evaluate", ["model=tiny", f"data.root={tmp_path}", f"evaluation.out={out}"])
        problems = [p for p in check_evaluation(cfg) if p.startswith("evaluation.out=")]
        assert len(problems) == 1 and where in problems[0], problems


def test_a_ranking_out_that_is_a_file_is_refused_by_name(tmp_path, capsys):
    file = tmp_path / "rankings"
    file.write_bytes(b"not a folder")
    runs = [_folder(tmp_path / name, ()) for name in ("a", "b")]
    with pytest.raises(SystemExit) as stopped:
        rank_main(["--runs", *map(str, runs), "--out", str(file), "--report-only"])
    assert stopped.value.code == USER_ERROR_EXIT_CODE
    assert f"error: --out {file}: {file} is a file, not a folder" in capsys.readouterr().err


def test_an_evaluation_played_again_sets_aside_the_earlier_report_before_it_rewrites_the_games(tmp_path):
    """Its games are played again in place: a replay stopped halfway must not leave the earlier gallery
    linking to clips not yet written again."""
    out = tmp_path / "eval"
    pages = ("metrics.json", "report.md", GALLERY_FILE, "benchmark.json", *STALE_PLOTS[:1])
    _folder(out, pages)
    _folder(out / GAMES_FOLDER / "film-000001")
    moved = set_aside_earlier_outputs(out, _benchmark("film-000001"), untrained=True, reconstruction=True)
    assert moved == [tmp_path / "eval.earlier-1"]
    assert sorted(p.name for p in out.iterdir()) == [GAMES_FOLDER]
    assert sorted(p.name for p in moved[0].iterdir()) == sorted(pages)
    # a folder without an earlier evaluation's metrics keeps its files (a first run stopped before its report)
    (out / "benchmark.json").write_text("{}")
    assert set_aside_earlier_outputs(out, _benchmark("film-000001"), untrained=True, reconstruction=True) == []

