"""Motion scope (animegamer.media.flow, animegamer.media.motion_bins): flow in output pixels whatever the
clip's width, and the levels at bin edges."""
from __future__ import annotations

import cv2
import numpy as np
import pytest
from motion_helpers import shifted_clip, smooth_texture

from animegamer.config.schema import MotionConfig
from animegamer.media.flow import clip_flow
from animegamer.media.motion_bins import MotionBins, compute_bins

# --------------------------------------------------------------------------- flow in output pixels
# The paper's clip width, wider than the analysis width: the flow is estimated on shrunk frames and
# must be scaled back to the clip's own pixels.
WIDE = 720
NARROW = 240  # narrower than the analysis width: estimated at the clip's own size
HEIGHT = 72  # a thin strip keeps Farneback to milliseconds
SHIFT = 12  # output pixels per frame at WIDE; WIDE / NARROW divides it
FRAMES = 4
# Coarse enough (cycles per pixel at WIDE) that the texture survives the shrink to the analysis width.
CUTOFF = 0.03
FLOW_REL_TOL = 0.05  # measured within 0.4 % of the shift


@pytest.fixture(scope="module")
def wide_clip() -> np.ndarray:
    return shifted_clip(smooth_texture(HEIGHT, WIDE, cutoff=CUTOFF), SHIFT, FRAMES)


def _narrowed(clip: np.ndarray, width: int) -> np.ndarray:
    """The same clip, the same motion, at ``width`` pixels across."""
    height = clip.shape[1] * width // clip.shape[2]
    return np.stack([cv2.resize(frame, (width, height), interpolation=cv2.INTER_AREA) for frame in clip])


def test_a_clip_wider_than_the_analysis_width_measures_its_shift_in_its_own_pixels(wide_clip):
    cfg = MotionConfig()
    assert WIDE / cfg.analysis_width > 2  # shrunk by more than 2x for the estimate
    assert clip_flow(wide_clip, cfg) == pytest.approx(SHIFT, rel=FLOW_REL_TOL)
    # Its level is that of SHIFT output pixels (level 4 of the fixed edges), not of the analysis pixels.
    fixed = compute_bins([], MotionConfig(bins="fixed"))
    assert fixed.level(clip_flow(wide_clip, cfg)) == 4 and fixed.level(SHIFT * cfg.analysis_width / WIDE) == 3


def test_the_same_motion_at_two_widths_gives_flows_in_the_ratio_of_the_widths(wide_clip):
    cfg = MotionConfig()
    assert NARROW < cfg.analysis_width < WIDE
    wide, narrow = clip_flow(wide_clip, cfg), clip_flow(_narrowed(wide_clip, NARROW), cfg)
    assert narrow == pytest.approx(SHIFT * NARROW / WIDE, rel=FLOW_REL_TOL)
    assert wide / narrow == pytest.approx(WIDE / NARROW, rel=FLOW_REL_TOL)


# --------------------------------------------------------------------------- levels at the edges
def _bins(edges: tuple[float, ...]) -> MotionBins:
    return MotionBins(edges, {}, "fixed", {})


def test_a_still_clip_is_level_one_when_several_edges_are_zero():
    bins = _bins((0.0, 0.0, 0.0, 2.0))
    assert bins.level(0.0) == 1
    assert bins.level(1e-9) == 4  # above every zero edge
    assert bins.level(2.0) == 4  # exactly on an edge: the lower level
    assert bins.level(2.0 + 1e-9) == 5


@pytest.mark.parametrize("flow, level", [(0.0, 1), (0.5, 1), (0.50001, 2), (2.5, 2), (2.50001, 4), (7.0, 4),
                                         (20.0, 4), (20.00001, 5)])
def test_a_flow_on_an_edge_takes_the_lower_level(flow, level):
    """Repeated edge 2.5: level 3's bin is empty, a flow of 2.5 is level 2 and anything above it level 4."""
    assert _bins((0.5, 2.5, 2.5, 20.0)).level(flow) == level


def test_quantile_bins_of_mostly_still_clips_put_every_still_clip_in_level_one():
    flows = [0.0] * 7 + [1.0, 2.0, 3.0]
    bins = compute_bins(flows, MotionConfig(bins="quantile"))
    assert bins.source == "quantile"
    assert bins.edges == pytest.approx((0.0, 0.0, 0.0, 1.2))  # np.quantile's linear interpolation at 0.8
    assert bins.counts == {1: 7, 2: 0, 3: 0, 4: 1, 5: 2}
    assert bins.level_flow[1] == 0.0 and bins.level_flow[4] == 1.0 and bins.level_flow[5] == 2.5
