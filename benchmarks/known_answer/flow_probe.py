"""How the pipeline's flow estimator reads the benchmark's true clips rendered imperfectly: a CPU check of what
each kind of renderer error does to the measured speed, to read a GPU run's motion sweep against.

Each held-in and held-out clip of a finished data set (``python -m benchmarks.known_answer.data OUT --clips-only``)
is degraded in one way at a time: blurred (a renderer that loses detail), mixed with its own still mean (one that
under-shoots the pan), or with its detail finer than ``sigma`` fixed as the first frame has it while the coarser
content moves (detail painted where the sampling noise put it: "texture sticking"), or drawn afresh in every frame
(flicker). Per degradation: the PSNR
against the clip, ACC-F against the clips' levels with the data set's own bins, Spearman's rho of level against
measured flow, and per level the mean flow and the detail persistence
(:mod:`animegamer.metrics.detail_persistence`).

    python -m benchmarks.known_answer.flow_probe OUT/pipeline [--latent-px 4] [--out probe.json]
"""
from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Callable, Sequence

import cv2
import numpy as np

from animegamer.config.schema import MotionConfig
from animegamer.contracts.files import CLIPS_DIR, MANIFEST
from animegamer.data.shards import folder_shards, iter_samples
from animegamer.errors import InvalidInputError, exit_on_user_error
from animegamer.evaluation.drawing import markdown_row
from animegamer.evaluation.motion_sweep import LEVELS, per_level_means, rank_correlation
from animegamer.metrics.detail_persistence import frame_persistence
from animegamer.metrics.motion import measure_levels
from animegamer.metrics.psnr import PSNR_CAP_DB, psnr
from animegamer.utils.io import write_json_atomic
from animegamer.utils.logging import setup_logging
from animegamer.utils.text import doc_summary

log = logging.getLogger(__name__)

LATENT_PX = 4  # output px per latent px of the known-answer sizes' VAE (the small preset)
BLUR_SIGMAS = (1.0, 2.0, 3.0)  # output px
STILL_SHARE = 0.5  # of the clip's mean over time mixed into every frame

Degradation = Callable[[np.ndarray], np.ndarray]


def _blur(frames: np.ndarray, sigma: float) -> np.ndarray:
    """Each frame (T, H, W, 3) blurred apart, in its own dtype."""
    return np.stack([cv2.GaussianBlur(frame, (0, 0), sigma) for frame in frames])


def blurred(sigma: float) -> Degradation:
    return lambda clip: _blur(clip, sigma)


def with_still_mean(share: float) -> Degradation:
    def degrade(clip: np.ndarray) -> np.ndarray:
        frames = clip.astype(np.float32)
        return np.clip((1 - share) * frames + share * frames.mean(axis=0, keepdims=True), 0, 255).astype(np.uint8)
    return degrade


def detail_fixed(sigma: float) -> Degradation:
    """Each frame's content coarser than ``sigma`` as drawn, its finer detail the first frame's."""
    def degrade(clip: np.ndarray) -> np.ndarray:
        frames = clip.astype(np.float32)
        coarse = _blur(frames, sigma)
        return np.clip(coarse + (frames[0] - coarse[0])[None], 0, 255).astype(np.uint8)
    return degrade


def detail_redrawn(sigma: float) -> Degradation:
    """Each frame's content coarser than ``sigma`` as drawn, its finer detail the first frame's moved to a random
    place in every frame: detail of the same kind, drawn afresh each frame (flicker)."""
    def degrade(clip: np.ndarray) -> np.ndarray:
        frames = clip.astype(np.float32)
        coarse = _blur(frames, sigma)
        detail = frames[0] - coarse[0]
        rng = np.random.default_rng(0)
        height, width = detail.shape[:2]
        moved = [detail] + [np.roll(detail, (int(rng.integers(height)), int(rng.integers(width))), axis=(0, 1))
                            for _ in range(1, len(frames))]
        return np.clip(coarse + np.stack(moved), 0, 255).astype(np.uint8)
    return degrade


def degradations(latent_px: float) -> dict[str, Degradation]:
    return {"as drawn": lambda clip: clip,
            **{f"blurred, sigma {s:g} px": blurred(s) for s in BLUR_SIGMAS},
            f"{STILL_SHARE:.0%} of the still mean mixed in": with_still_mean(STILL_SHARE),
            f"detail under {latent_px / 2:g} px fixed to the screen": detail_fixed(latent_px / 2),
            f"detail under {latent_px:g} px (a latent px) fixed to the screen": detail_fixed(latent_px),
            f"detail under {latent_px:g} px (a latent px) drawn afresh every frame": detail_redrawn(latent_px)}


def read_clips(pipeline: Path) -> tuple[list[np.ndarray], list[int], dict, MotionConfig]:
    """The clips (T, H, W, 3) and levels of ``pipeline/clips``, its bins and the motion settings it was cut with."""
    folder = pipeline / CLIPS_DIR
    manifest = folder / MANIFEST
    if not manifest.is_file():
        raise InvalidInputError(f"{manifest}: not found; give the pipeline folder of a finished data set")
    record = json.loads(manifest.read_text(encoding="utf-8"))
    try:
        bins, motion = record["motion_bins"], MotionConfig(**record["config"]["pipeline"]["motion"])
    except (KeyError, TypeError) as error:
        raise InvalidInputError(f"{manifest}: no motion bins or motion settings ({error})") from None
    clips, levels = [], []
    for sample in iter_samples(folder_shards(folder)):
        clips.append(np.asarray(sample["mp4"]))
        levels.append(int(sample["json"]["motion"]["level"]))
    if not clips:
        raise InvalidInputError(f"{folder}: no clip in its shards")
    return clips, levels, bins, motion


def frames_row(name: str, rendered: list[np.ndarray], clips: list[np.ndarray], levels: list[int], bins: dict,
               motion: MotionConfig, latent_px: float) -> dict:
    """How the flow estimator and the detail persistence read ``rendered``, the clips (T, H, W, 3) made
    another way: PSNR against the true ``clips``, ACC-F against their ``levels``, rho, and per level the
    mean flow and persistence."""
    flows, measured = measure_levels(rendered, bins, motion)
    scores = [p for p in (psnr(r, c) for r, c in zip(rendered, clips)) if p < PSNR_CAP_DB]  # not the unchanged
    row = {"degradation": name, "psnr": float(np.mean(scores)) if scores else None,
           "acc_f": float(np.mean(np.asarray(measured) == np.asarray(levels))),
           "rank_correlation": rank_correlation(levels, flows),
           "flow_per_level": per_level_means(levels, flows),
           "persistence_per_level": per_level_means(levels, [frame_persistence(r, latent_px) for r in rendered])}
    log.info("%s: ACC-F %.3f", name, row["acc_f"])
    return row


def probe(pipeline: Path, latent_px: float = LATENT_PX) -> dict:
    clips, levels, bins, motion = read_clips(pipeline)
    rows = [frames_row(name, [degrade(clip) for clip in clips], clips, levels, bins, motion, latent_px)
            for name, degrade in degradations(latent_px).items()]
    return {"pipeline": str(pipeline), "clips": len(clips), "latent_px": latent_px, "rows": rows}


def per_level_text(values: dict) -> str:
    return " / ".join(f"{v:.2f}" for v in values.values())


def markdown(result: dict) -> str:
    head = " / ".join(map(str, LEVELS))
    lines = [f"{result['clips']} clips of {result['pipeline']}; a latent px is {result['latent_px']:g} output px.", "",
             f"| degradation | PSNR (dB) | ACC-F | rho | flow per level ({head}) | detail persistence per level |",
             "|---|---:|---:|---:|---|---|"]
    lines += [markdown_row(*frames_cells(row)) for row in result["rows"]]
    return "\n".join(lines) + "\n"


def frames_cells(row: dict) -> list[str]:
    """A row's name, PSNR, ACC-F, rho, flow and persistence per level as table cells."""
    rho = row["rank_correlation"]
    return [row["degradation"], "" if row["psnr"] is None else f"{row['psnr']:.1f}", f"{row['acc_f']:.3f}",
            "n/a" if rho is None else f"{rho:.3f}", per_level_text(row["flow_per_level"]),
            per_level_text(row["persistence_per_level"])]


def probe_parser(module: str, doc: str) -> argparse.ArgumentParser:
    """The probes' command line: the data set's pipeline folder and ``--out``; each adds its own options."""
    parser = argparse.ArgumentParser(prog=f"python -m {module}", description=doc_summary(doc))
    parser.add_argument("pipeline", type=Path, help="the data set's pipeline folder (holding clips/)")
    parser.add_argument("--out", type=Path, default=None, help="also write the result here as JSON")
    return parser


def report(title: str, result: dict, out: Path | None, table: Callable[[dict], str]) -> int:
    """Writes a probe's ``result`` to ``out`` (when given) and logs its ``table``."""
    if out:
        write_json_atomic(out, result)
    log.info("%s:\n%s", title, table(result))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = probe_parser(__spec__.name if __spec__ else __name__, __doc__)
    parser.add_argument("--latent-px", type=float, default=LATENT_PX, help="output px per latent px")
    args = parser.parse_args(argv)
    setup_logging("INFO")
    return report("flow probe", exit_on_user_error(probe)(args.pipeline, args.latent_px), args.out, markdown)


if __name__ == "__main__":
    raise SystemExit(main())
