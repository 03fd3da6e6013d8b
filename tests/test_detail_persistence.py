"""Fine-detail persistence (``animegamer.metrics.detail_persistence``): a pan loses it, a still clip and detail
fixed to the screen keep it, on frames and on latents; and the motion sweep's record and report carry it with the
true clips' values beside the renderings'."""
from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from animegamer.evaluation.motion_sweep import (
    LATENT_PERSISTENCE,
    LEVELS,
    PERSISTENCE_HEADLINE,
    PIXEL_FLOW,
    PIXEL_PERSISTENCE,
    REFERENCE,
    headline,
    markdown,
    per_level_means,
    plot,
    sweep,
    with_truth,
)
from animegamer.metrics.detail_persistence import fine_detail_correlation, frame_persistence, latent_persistence
from benchmarks.known_answer.flow_probe import detail_fixed

FRAMES, HEIGHT, WIDTH = 17, 64, 96
LATENT_PX = 4.0  # output px per latent px, as the small preset's VAE compresses


def _canvas(seed: int, width: int = WIDTH * 3) -> np.ndarray:
    """A textured RGB backdrop (H, width, 3), uint8, with detail at about a pixel and at a few."""
    rng = np.random.default_rng(seed)
    fine = cv2.GaussianBlur(rng.standard_normal((HEIGHT, width)).astype(np.float32), (0, 0), 0.8)
    coarse = cv2.GaussianBlur(rng.standard_normal((HEIGHT, width)).astype(np.float32), (0, 0), 6.0)
    gray = 128 + 60 * fine / fine.std() + 40 * coarse / coarse.std()
    return np.repeat(np.clip(gray, 0, 255)[..., None], 3, axis=-1).astype(np.uint8)


def _pan(speed: float, seed: int = 0) -> np.ndarray:
    """(T, H, W, 3): a window sliding over the backdrop at ``speed`` px per frame (whole px, no resampling)."""
    canvas = _canvas(seed)
    return np.stack([canvas[:, round(speed * t): round(speed * t) + WIDTH] for t in range(FRAMES)])


def test_a_pan_loses_its_fine_detail_and_a_still_clip_keeps_it() -> None:
    assert frame_persistence(_pan(0.0), LATENT_PX) == pytest.approx(1.0)
    for speed in (1.0, 2.0, 4.0):
        assert abs(frame_persistence(_pan(speed), LATENT_PX)) < 0.2, speed


def test_detail_fixed_to_the_screen_keeps_it_while_the_content_moves() -> None:
    """The renderer that moves its coarse content and not its detail: the flow it shows is the still detail's."""
    for speed in (1.0, 4.0):
        assert frame_persistence(detail_fixed(LATENT_PX)(_pan(speed)), LATENT_PX) > 0.9, speed
    # detail only partly held: in between, ordered
    moving, stuck = _pan(2.0), detail_fixed(LATENT_PX)(_pan(2.0))
    half = ((moving.astype(np.float32) + stuck) / 2).astype(np.uint8)
    assert frame_persistence(moving, LATENT_PX) < frame_persistence(half, LATENT_PX) < frame_persistence(stuck, LATENT_PX)


def test_latents_are_measured_per_channel_first_frame_to_last() -> None:
    generator = torch.Generator().manual_seed(0)
    texture = torch.randn(4, 16, 80, generator=generator)
    moving = torch.stack([texture[..., 3 * t: 3 * t + 24] for t in range(5)])  # (T', C, H, W), 3 latent px a frame
    still = texture[..., :24].expand(5, -1, -1, -1)
    assert latent_persistence(still) == pytest.approx(1.0)
    assert abs(latent_persistence(moving)) < 0.2
    # one channel still and three moving: a quarter of the detail energy kept, about
    mixed = moving.clone()
    mixed[:, 0] = still[:, 0]
    assert 0.1 < latent_persistence(mixed) < 0.45


def test_what_cannot_be_measured_is_refused() -> None:
    flat = np.full((FRAMES, HEIGHT, WIDTH, 3), 90, dtype=np.uint8)
    with pytest.raises(ValueError, match="without fine detail"):
        frame_persistence(flat, LATENT_PX)
    with pytest.raises(ValueError, match="RGB frames"):
        frame_persistence(flat[:1], LATENT_PX)
    with pytest.raises(ValueError, match="one latent clip"):
        latent_persistence(torch.zeros(1, 4, 8, 8))
    with pytest.raises(ValueError, match="sigma"):
        fine_detail_correlation(flat[0, ..., 0], flat[1, ..., 0], 0.0)


def test_the_sweep_record_and_report_carry_the_true_clips_beside_the_renderings(tmp_path: Path) -> None:
    """A renderer whose detail sticks at every level against clips that pan: both in the record, the report
    line and the plot."""
    flows = {level: [0.0, 0.5, 1.0, 2.0, 4.0][level - 1] for level in LEVELS}
    clips = 2

    def render(clip: int, flow: float) -> np.ndarray:
        return detail_fixed(LATENT_PX)(_pan(round(flow), seed=clip))

    result = sweep(render, clips, flows, {
        PIXEL_FLOW: lambda rendered: [float(level) for level in range(len(rendered))],
        PIXEL_PERSISTENCE: lambda rendered: [frame_persistence(f, LATENT_PX) for f in rendered]})
    truth_levels = [1, 5]
    with_truth(result, PIXEL_PERSISTENCE, truth_levels,
               [frame_persistence(_pan(flows[level], seed=clip), LATENT_PX) for clip, level in enumerate(truth_levels)])
    measure = result["measures"][PIXEL_PERSISTENCE]
    assert min(min(row) for row in measure["values"]) > 0.9  # stuck at every level
    assert measure[REFERENCE]["levels"] == truth_levels
    assert measure[REFERENCE]["values"][0] == pytest.approx(1.0) and abs(measure[REFERENCE]["values"][1]) < 0.2
    assert per_level_means(truth_levels, measure[REFERENCE]["values"]) == \
        pytest.approx({1: 1.0, 5: measure[REFERENCE]["values"][1]})
    assert REFERENCE not in result["measures"][PIXEL_FLOW]
    # a measure left out is given no reference
    result["measures"]["unmeasured"] = {"unit": "", "reason": "no clip"}
    with_truth(result, "unmeasured", [1], [1.0])
    assert REFERENCE not in result["measures"]["unmeasured"]
    # the headline: the renderings above the slowest level against the swept clips' own above it
    found = headline(result)
    rendered, truth = PERSISTENCE_HEADLINE[PIXEL_PERSISTENCE]
    assert found[rendered]["value"] == pytest.approx(np.mean([row[1:] for row in measure["values"]]))
    assert found[truth]["value"] == pytest.approx(measure[REFERENCE]["values"][1])  # the level-5 clip alone
    assert found[rendered]["value"] > 0.9 > 0.2 > found[truth]["value"]
    assert not any(found[key]["available"] for key in PERSISTENCE_HEADLINE[LATENT_PERSISTENCE])  # not measured
    only_still = dict(measure, **{REFERENCE: {"levels": [1], "values": [1.0]}})
    assert headline({"measures": {PIXEL_PERSISTENCE: only_still}})[truth]["reason"] == \
        f"no swept clip of its own above level {LEVELS[0]}"
    text = "\n".join(markdown(result, None))
    assert "The true clips, each at its own level" in text
    assert f"detail persistence 1: 1.00 / 5: {measure[REFERENCE]['values'][1]:.2f}" in text
    assert plot(result, tmp_path / "sweep.png") and (tmp_path / "sweep.png").stat().st_size > 0


def test_the_known_answer_table_reads_persistence_lower_is_better_and_its_truth_as_no_score(tmp_path: Path) -> None:
    from benchmarks.known_answer.report import RECONSTRUCTION, comparisons, write_table

    rendered, truth = PERSISTENCE_HEADLINE[PIXEL_PERSISTENCE]
    base = f"decoder base: {RECONSTRUCTION}"
    rows = [{"row": RECONSTRUCTION, "metrics": {rendered: 0.3, truth: 0.15}},
            {"row": base, "metrics": {rendered: 0.9, truth: 0.15}}]
    found = comparisons(rows)
    assert found[f"{RECONSTRUCTION}: {rendered}"][base]["margin"] == pytest.approx(0.6)  # lower: better by 0.6
    assert f"{RECONSTRUCTION}: {truth}" not in found
    write_table(tmp_path / "table.md", rows, {"size": "ci", "seed": 0})
    text = (tmp_path / "table.md").read_text()
    assert f"Lower is better for {rendered}; higher for the rest but {truth}: the swept clips' own value" in text


def test_the_latent_probe_degrades_latents_as_it_says() -> None:
    """benchmarks/known_answer/latent_probe.py: detail fixed to the latent grid keeps the latents' coarse pan and
    their detail's persistence; blur and the still mean keep each frame's mean; the round trip changes nothing."""
    from benchmarks.known_answer.latent_probe import FINE_SIGMA, latent_degradations
    from animegamer.metrics.latent_motion import clip_speed

    generator = torch.Generator().manual_seed(0)
    texture = torch.randn(4, 16, 80, generator=generator)
    moving = torch.stack([texture[..., 2 * t: 2 * t + 32] for t in range(5)])  # (T', C, H, W), 2 latent px a frame
    rows = latent_degradations()
    assert torch.equal(rows["as encoded (the VAE round trip)"](moving), moving)
    fixed = rows[f"latent detail under {FINE_SIGMA:g} latent px fixed to the grid"](moving)
    assert torch.allclose(fixed[0], moving[0], atol=1e-5)  # the first latent frame as encoded
    assert latent_persistence(fixed) > 0.9 > 0.2 > abs(latent_persistence(moving))
    assert clip_speed(moving) == pytest.approx(2.0, abs=0.1)
    for name, degrade in rows.items():
        out = degrade(moving)
        assert out.shape == moving.shape, name
        assert torch.allclose(out.mean(dim=(-2, -1)), moving.mean(dim=(-2, -1)), atol=0.05) or "still" in name, name


def test_the_latent_probe_refuses_a_folder_without_a_vae_before_reading_clips(tmp_path: Path) -> None:
    from benchmarks.known_answer.latent_probe import main

    with pytest.raises(SystemExit) as refused:
        main([str(tmp_path / "no_such_pipeline"), "--vae", str(tmp_path)])
    assert refused.value.code == 2
