"""The Table 3 recipe: each variant trained as its own model (own warm-up, the baseline's, or none),
scored with the reconstruction metrics into one table; a re-run trains and scores nothing again."""
from __future__ import annotations

import json

import pytest

from animegamer.ablations import (BASELINE, DEFAULT_OUT, METRICS, MINUS_SHUFFLED, NONE, OWN, SCORED_WITH, Variant,
                                  experiment_of, main, plan, saved_scores, scored_with, variant_names, write_table)
from animegamer.checkpoints.export_checks import check_export_sizes
from animegamer.config.compose import compose_config
from animegamer.contracts.files import METRICS_FILE
from animegamer.evaluation.report import PAPER_TABLE3_RECONSTRUCTION

TINY = ["model=tiny", "trainer=cpu", "logger=none"]


def test_every_variant_has_a_warmup_its_sizes_fit(tmp_path):
    """Variants that change what the warm-up trains warm up on their own; no_warmup has none; each
    experiment file starts a2 from the warm-up the recipe writes for it."""
    variants = {v.name: v for v in plan(variant_names(), DEFAULT_OUT, TINY)}
    assert set(variants) == {BASELINE, "addition", "cross_attention", "less_params", "no_motion_scope", "no_warmup",
                             "random_frame"}
    assert {n: v.warmup for n, v in variants.items()} == {**{n: OWN for n in variants}, "no_warmup": NONE}
    for name, variant in variants.items():
        if name == BASELINE:
            continue
        cfg = compose_config("train", [f"experiment={variant.experiment}"])
        assert cfg.phase.init_from == ("" if name == "no_warmup" else variant.export("a_warmup"))


def test_saved_scores_are_kept_only_for_the_same_data_seed_and_sampling(tmp_path):
    """What the reconstruction scores depend on besides the export and evaluation.*: the held-out data, the
    seed, and the model's settings (the sampler's steps, guidance and step cache)."""
    from animegamer.config.compose import compose_config
    from animegamer.recipe import evaluation_of
    from animegamer.utils.io import write_json_atomic

    base = [f"experiment={experiment_of(BASELINE)}", *TINY, f"data.root={tmp_path}"]
    # as the recipe scores a variant: the evaluation of its training config
    evaluation_config = lambda trained: evaluation_of(compose_config("train", trained), ["evaluation.sampling_steps=0"])
    settings = scored_with(evaluation_config(base))
    done = tmp_path / METRICS_FILE
    write_json_atomic(done, {"metrics": {"export_sha256": "d", SCORED_WITH: settings, "clips": 1}})
    assert saved_scores(done, "d", settings)["clips"] == 1 and saved_scores(done, "e", settings) is None
    for change in (f"data.root={tmp_path / 'other'}", "data.val_fraction=0.3", "seed=7",
                   "model.diffusion.sampling_steps=3", "model.diffusion.guidance_scale=1.0"):
        assert saved_scores(done, "d", scored_with(evaluation_config([*base, change]))) is None, change


@pytest.fixture(scope="module")
def clip_model(tmp_path_factory):
    from animegamer.metrics.clip_scores import ClipScorer

    folder = tmp_path_factory.mktemp("clip")
    scorer = ClipScorer.random(seed=0)
    scorer.model.save_pretrained(folder)
    scorer.tokenizer.save_pretrained(folder)
    return folder


def test_table3_recipe_on_tiny_models(toy_run, clip_model, tmp_path):
    output, _ = toy_run
    out = tmp_path / "Howl's table3, [2] =x"  # a name Hydra's grammar would misread unquoted: each stage gets it
    argv = ["--out", str(out), "--only", "addition", "no_warmup", "--steps", "1", "1", *TINY, f"data.root={output}",
            "pipeline.clips.height=64", "pipeline.clips.width=96", "data.val_fraction=0.2", "phase.batch_size=2",
            "phase.val_clips=0", "evaluation.reconstruction_clips=1", "evaluation.sampling_steps=1",
            f"evaluation.clip_model={clip_model}"]
    table = main(argv)
    rows = {row["variant"]: row for row in table["variants"]}
    assert [row["variant"] for row in table["variants"]] == [BASELINE, "addition", "no_warmup"]
    assert {n: r["warmup"] for n, r in rows.items()} == {BASELINE: OWN, "addition": OWN, "no_warmup": NONE}
    assert table["paper"][BASELINE] == PAPER_TABLE3_RECONSTRUCTION
    for name, row in rows.items():
        assert row["clips"] == 1 and row["clip_i"]["available"] and -1 <= row["clip_i"]["value"] <= 1
        recorded = json.loads((out / name / "a_joint" / "export" / "export.json").read_text())["config"]
        assert recorded["phase"]["init_from"] == ("" if name == "no_warmup" else str(out / name / "a_warmup" / "export"))
    assert not (out / "no_warmup" / "a_warmup").exists()
    # The addition encoder cannot start from the baseline's warm-up (the reason it has its own).
    addition = compose_config("train", ["experiment=ablation_a_addition", *TINY])
    assert check_export_sizes("phase.init_from", str(out / BASELINE / "a_warmup" / "export"), addition.model)
    assert not check_export_sizes("phase.init_from", str(out / "addition" / "a_warmup" / "export"), addition.model)
    markdown = (out / "table3.md").read_text()
    assert f"| addition | own | 1 | {rows['addition']['clip_i']['value']:.4f} |" in markdown and "0.8672" in markdown
    # one held-out clip: PSNR measured; the shuffled baseline needs two, so its gap is n/a with the reason
    assert rows["addition"]["psnr"]["available"] and f"| {rows['addition']['psnr']['value']:.2f} |" in markdown
    assert not rows["addition"][MINUS_SHUFFLED]["psnr"]["available"]
    assert "1 held-out clip: shuffling needs at least 2" in markdown

    stamps = lambda: {p: p.stat().st_mtime_ns for p in [*out.rglob("*.ckpt"), *out.rglob("reconstruction/*")]}
    before = stamps()
    assert main(argv)["variants"] == table["variants"]  # resumed at the last step, the same scores: nothing redone
    assert stamps() == before

    # The whole folder moved elsewhere (every stage's start and folder path changes): nothing redone there either.
    moved = tmp_path / "moved"
    out.rename(moved)
    out = moved
    before = stamps()
    again = main([*argv[:1], str(moved), *argv[2:]])["variants"]
    assert [{**row, "export": None} for row in again] == [{**row, "export": None} for row in table["variants"]]
    assert stamps() == before


def test_table3_shows_every_measured_metric_and_footnotes_what_was_not(tmp_path):
    """A CPU run without CLIP or DreamSim weights still measures PSNR, ACC-F and MAE-F, and the gap to the
    shuffled representation: the table shows them; each n/a cell points to a footnote with its reason."""
    from animegamer.metrics.common import available, unavailable

    no_clip, no_dreamsim = unavailable("no CLIP weights (evaluation.clip_model)"), unavailable("no DreamSim weights")

    def scores(psnr: float, acc_f: float, shuffled_psnr: float, shuffled_acc_f: float) -> dict:
        measured = lambda p, a: {"clip_i": no_clip, "dreamsim": no_dreamsim, "psnr": available(p),
                                 "acc_f": available(a), "mae_f": available(1 - a)}
        return {"export": "x", "clips": 4, **measured(psnr, acc_f),
                "baselines": {"shuffled": {"label": "shuffled", **measured(shuffled_psnr, shuffled_acc_f)}}}

    rows = {BASELINE: scores(21.5, 0.75, 19.25, 0.5), "no_warmup": scores(18.0, 0.25, 18.5, 0.5)}
    write_table(tmp_path, rows, [Variant(BASELINE, OWN, tmp_path), Variant("no_warmup", NONE, tmp_path)])
    markdown = (tmp_path / "table3.md").read_text()
    assert "| CLIP-I | DreamSim | PSNR (dB) | ACC-F | MAE-F | paper CLIP-I | paper DreamSim |" in markdown
    assert "| baseline | own | 4 | n/a [1] | n/a [2] | 21.50 | 0.7500 | 0.2500 | 0.8672 | 0.7928 |" in markdown
    assert "| no_warmup | none | 4 | n/a [1] | n/a [2] | 18.00 | 0.2500 | 0.7500 | not recorded | not recorded |" in markdown
    # own minus shuffled: PSNR +2.25 dB, ACC-F +0.25, MAE-F -0.25 for the baseline; the no-warm-up row below zero
    assert "| baseline | n/a [1] | n/a [2] | +2.25 | +0.2500 | -0.2500 |" in markdown
    assert "| no_warmup | n/a [1] | n/a [2] | -0.50 | -0.2500 | +0.2500 |" in markdown
    assert "- [1] no CLIP weights (evaluation.clip_model)" in markdown and "- [2] no DreamSim weights" in markdown
    table = json.loads((tmp_path / "table3.json").read_text())
    baseline = table["variants"][0]
    assert [baseline[m]["available"] for m in METRICS] == [False, False, True, True, True]
    assert baseline[MINUS_SHUFFLED]["psnr"]["value"] == pytest.approx(2.25)


def test_a_setting_every_stage_shares_is_refused_once(tmp_path):
    from animegamer.config.validate import ConfigError

    with pytest.raises(ConfigError) as refused:
        main(["--out", str(tmp_path / "t3"), "--steps", "5", "5", *TINY, "phase.lr=-1", f"data.root={tmp_path / 'none'}"])
    assert refused.value.problems == [
        "every stage: phase.lr=-1.0 must be > 0",
        f"every stage: data.root='{tmp_path / 'none'}': no such folder; run the pipeline first (animegamer pipeline "
        "...) or set data.root"]
    assert not (tmp_path / "t3").exists()
