"""Whether the VAE turns latents that move into frames that do not: the benchmark's true clips encoded by its
VAE, their latents degraded one way at a time, decoded, and read as :mod:`benchmarks.known_answer.flow_probe`
reads frames, with the latents' own sideways speed and detail persistence beside the frames'.

A decoder that moves its latents' coarse content but leaves their finest content smoother than the VAE's own, or
fixed to the latent grid, may decode to frames whose detail stays on the screen: the latents then measure a pan
(:func:`animegamer.metrics.latent_motion.clip_speed`) and the frames far less. Per degradation: the PSNR against
the clip, ACC-F, Spearman's rho of level against measured flow, and per level the frames' flow and detail
persistence and the latents' speed and detail persistence. The first row, the latents as encoded, is the VAE
round trip every other row reads against.

    python -m benchmarks.known_answer.latent_probe OUT/pipeline --vae OUT/vae [--device cuda] [--clips N]
        [--out probe.json]
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable, Sequence

import cv2
import numpy as np
import torch

from animegamer.config.schema import VAEConfig
from animegamer.errors import InvalidInputError, exit_on_user_error
from animegamer.evaluation.drawing import markdown_row
from animegamer.evaluation.motion_sweep import LEVELS, per_level_means
from animegamer.game.render import decode_frames
from animegamer.metrics.detail_persistence import latent_persistence
from animegamer.metrics.latent_motion import clip_speed
from animegamer.models.frozen_vae import FrozenVAE
from animegamer.utils.logging import setup_logging
from benchmarks.known_answer.flow_probe import (
    STILL_SHARE,
    frames_cells,
    frames_row,
    per_level_text,
    probe_parser,
    read_clips,
    report,
)

log = logging.getLogger(__name__)

LATENT_BLUR_SIGMAS = (0.5, 1.0)  # latent px
FINE_SIGMA = 1.0  # latent px: the detail a latent pixel holds apart from its neighbours

LatentDegradation = Callable[[torch.Tensor], torch.Tensor]


def blur_latents(latents: torch.Tensor, sigma: float) -> torch.Tensor:
    """Each channel of each latent frame (T', C, H, W) blurred apart at ``sigma`` latent px."""
    values = latents.float().cpu().numpy()
    flat = values.reshape(-1, *values.shape[-2:])  # (T' * C, H, W): one image per frame and channel
    blurred = np.stack([cv2.GaussianBlur(image, (0, 0), sigma) for image in flat]).reshape(values.shape)
    return torch.from_numpy(blurred)


def latent_detail_fixed(sigma: float) -> LatentDegradation:
    """Each latent frame's content coarser than ``sigma`` as encoded, its finer detail the first latent frame's."""
    def degrade(latents: torch.Tensor) -> torch.Tensor:
        coarse = blur_latents(latents, sigma)
        return coarse + (latents.float() - coarse)[:1]
    return degrade


def latent_still_mean(share: float) -> LatentDegradation:
    def degrade(latents: torch.Tensor) -> torch.Tensor:
        values = latents.float()
        return (1 - share) * values + share * values.mean(dim=0, keepdim=True)
    return degrade


def latent_degradations() -> dict[str, LatentDegradation]:
    return {"as encoded (the VAE round trip)": lambda latents: latents.float(),
            **{f"latents blurred, sigma {s:g} latent px": (lambda latents, s=s: blur_latents(latents, s))
               for s in LATENT_BLUR_SIGMAS},
            f"latents' {STILL_SHARE:.0%} still mean mixed in": latent_still_mean(STILL_SHARE),
            f"latent detail under {FINE_SIGMA:g} latent px fixed to the grid": latent_detail_fixed(FINE_SIGMA)}


def check_vae_folder(folder: Path) -> None:
    if not (folder / "config.json").is_file():
        raise InvalidInputError(f"{folder}: no config.json; give a trained VAE folder (python -m animegamer.toy_vae)")


def probe(pipeline: Path, vae_folder: Path, device: str = "cpu", max_clips: int | None = None) -> dict:
    check_vae_folder(vae_folder)  # before the clips are read
    clips, levels, bins, motion = read_clips(pipeline)
    if max_clips is not None:  # every level keeps its share: the clips are in the shards' order, not by level
        clips, levels = clips[:max_clips], levels[:max_clips]
    vae = FrozenVAE(VAEConfig(path=str(vae_folder))).to(device).eval()
    latents = [vae.encode(clip[None])[0].float().cpu() for clip in clips]  # (T', C, H, W) each, posterior mode
    latent_px = clips[0].shape[2] / latents[0].shape[-1]
    rows = []
    for name, degrade in latent_degradations().items():
        degraded = [degrade(z) for z in latents]
        row = frames_row(name, [decode_frames(vae, z[None])[0] for z in degraded], clips, levels, bins, motion, latent_px)
        row["latent_speed_per_level"] = per_level_means(levels, [clip_speed(z) for z in degraded])
        row["latent_persistence_per_level"] = per_level_means(levels, [latent_persistence(z) for z in degraded])
        rows.append(row)
    return {"pipeline": str(pipeline), "vae": str(vae_folder), "clips": len(clips), "latent_px": latent_px,
            "rows": rows}


def markdown(result: dict) -> str:
    head = " / ".join(map(str, LEVELS))
    lines = [f"{result['clips']} clips of {result['pipeline']} through the VAE {result['vae']}; a latent px is "
             f"{result['latent_px']:g} output px.", "",
             f"| latents | PSNR (dB) | ACC-F | rho | frames' flow per level ({head}) | frames' detail persistence | "
             "latents' speed per level | latents' detail persistence |", "|---|---:|---:|---:|---|---|---|---|"]
    lines += [markdown_row(*frames_cells(row), per_level_text(row["latent_speed_per_level"]),
                           per_level_text(row["latent_persistence_per_level"])) for row in result["rows"]]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = probe_parser(__spec__.name if __spec__ else __name__, __doc__)
    parser.add_argument("--vae", type=Path, required=True, help="the VAE folder trained on those clips")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--clips", type=int, default=None, help="only the first N clips")
    args = parser.parse_args(argv)
    setup_logging("INFO")
    result = exit_on_user_error(probe)(args.pipeline, args.vae, args.device, args.clips)
    return report("latent probe", result, args.out, markdown)

if __name__ == "__main__":
    raise SystemExit(main())
