"""PSNR on 8-bit clips against hand computations: a known MSE gives a known dB, identical clips the
documented cap, full-range errors no uint8 wrap-around, mismatched clips an unavailable metric."""
from __future__ import annotations

import math

import numpy as np
import pytest

from animegamer.metrics.psnr import PSNR_CAP_DB, clip_psnr, psnr

SHAPE = (4, 6, 8, 3)  # (T, H, W, 3)
DB = 1e-5  # torchmetrics holds the data range in float32: its dB agree with float64 to about 1e-6


def test_a_known_mse_gives_the_hand_computed_psnr():
    truth = np.full(SHAPE, 100, np.uint8)
    # every value off by 10: MSE 100 -> 10 log10(255^2 / 100) = 28.1308 dB
    assert psnr(truth + 10, truth) == pytest.approx(10 * math.log10(255**2 / 100), abs=DB)
    assert psnr(truth + 10, truth) == pytest.approx(28.1308, abs=1e-4)
    # three values in four off by 2 (either sign), the fourth exact: MSE 3 -> 43.3596 dB
    frames = truth.copy()
    frames.reshape(-1)[::2] += 2
    frames.reshape(-1)[1::4] -= 2
    assert np.mean((frames.astype(float) - truth) ** 2) == 3.0
    assert psnr(frames, truth) == pytest.approx(43.3596, abs=1e-4)


def test_identical_clips_score_the_cap_and_nothing_exceeds_it():
    clip = np.random.default_rng(0).integers(0, 256, SHAPE, dtype=np.uint8)
    assert psnr(clip, clip) == PSNR_CAP_DB == 100.0
    assert clip_psnr(clip, clip) == {"value": 100.0, "available": True}
    one_off = clip.copy()
    one_off[0, 0, 0, 0] ^= 1  # one level on one value of 576: 10 log10(255^2 * 576) = 75.77 dB, under the cap
    assert psnr(one_off, clip) == pytest.approx(10 * math.log10(255**2 * clip.size), abs=DB)


def test_full_range_errors_do_not_wrap_around_in_uint8():
    black, white = np.zeros(SHAPE, np.uint8), np.full(SHAPE, 255, np.uint8)
    assert psnr(black, white) == pytest.approx(0.0, abs=DB)  # MSE 255^2; a uint8 difference would give 1
    assert psnr(white, black) == pytest.approx(0.0, abs=DB)


def test_mismatched_or_missing_truth_is_unavailable_and_other_dtypes_are_refused():
    clip = np.zeros(SHAPE, np.uint8)
    shorter = clip[:2]
    assert not clip_psnr(clip, shorter)["available"] and "(2, 6, 8, 3)" in clip_psnr(clip, shorter)["reason"]
    assert clip_psnr(clip, None)["reason"] == "no ground-truth clip"
    with pytest.raises(ValueError, match="one shape"):
        psnr(clip, shorter)
    with pytest.raises(TypeError, match="8-bit"):
        psnr(clip.astype(np.float32), clip)
