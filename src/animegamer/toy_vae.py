"""Train the frozen VAE of a model preset on a pipeline output's clips, so that it reconstructs.

    python -m animegamer.toy_vae OUT --data PIPELINE_OUTPUT [--model tiny] [--steps N] [--device cuda]
        [--init EARLIER_OUT] [override ...]

The tiny presets' frozen VAE has random weights and gives no pixels back; this trains the preset's own
``AutoencoderKLCogVideoX`` (``model.encoders.vae``, the class of the paper's VAE, so every code path
stays the same) on the clip shards of ``PIPELINE_OUTPUT/clips``, never on a held-out shot (the split of
:mod:`animegamer.data.split` at ``--val-fraction``), and writes ``OUT`` as a diffusers folder
(``config.json`` + safetensors) that ``model.encoders.vae.path=OUT`` loads as the frozen VAE of every
other stage. Its ``scaling_factor`` is set so that scaled latents of the training clips have unit
standard deviation, as CogVideoX's own factor is meant. ``OUT/training.json`` records the held-out PSNR
(posterior mode, 8-bit output, as precompute and the game use it) measured again after loading ``OUT``
through :class:`~animegamer.models.frozen_vae.FrozenVAE`, the learning curve and the settings.

Training runs in stages where one run's time is limited: ``--init EARLIER_OUT`` starts from the weights of
an earlier run's folder (the same preset's VAE config) instead of the random build. It is a warm restart,
not a resume: the optimiser starts afresh, with its own warm-up and cosine decay over this run's
``--steps`` / ``--max-seconds``; its batches continue the chain's random draws (from the chain's step count
on) rather than repeat the first stage's. The earlier folder's identity (the sha256 of its weights, its held-out
PSNR and its own ``init``, so a chain records every link) is part of this folder's identity and record
(``init``); ``steps_done`` counts this stage's steps and ``total_steps`` those of the whole chain.

``OUT`` is reused, not trained again, when its record says it was made from the same clips (their
content), VAE config, encoder seed, settings and ``--init`` weights.
"""
from __future__ import annotations

import argparse
import logging
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from omegaconf import OmegaConf

from animegamer.config.compose import compose_config
from animegamer.config.schema import VAEConfig
from animegamer.config.validate import device_problems
from animegamer.contracts.files import CLIPS_DIR
from animegamer.data.shards import folder_shards, iter_samples
from animegamer.data.split import HeldOut
from animegamer.data.trained_data import clip_content_sha256
from animegamer.errors import InvalidInputError, MissingInputError, UserError, exit_on_user_error
from animegamer.models.frozen_vae import FrozenVAE
from animegamer.models.vae_training import (
    LossWeights,
    latent_moments,
    psnr,
    reconstruct,
    reconstruction_loss,
    trainable_vae,
)
from animegamer.utils.io import atomic_dir, read_json, read_json_if_exists, sha256_file, write_json_atomic
from animegamer.utils.logging import setup_logging
from animegamer.utils.randomness import step_generator, step_seed
from animegamer.utils.text import doc_summary

logger = logging.getLogger(__name__)

TRAINING_RECORD = "training.json"
LOG_EVERY_N_STEPS = 25
SCALE_CLIPS = 256  # training clips whose latents set the scaling factor: plenty for one std
FRAME_AXIS_W = 3  # (B, T, H, W, 3): width axis, flipped for augmentation
# Crops are 8k + 1 frames: CogVideoX's decoder gives 4k + 1 frames back only from an odd number of
# latent frames (measured with diffusers 0.42: 9 -> 3 -> 9 and 17 -> 5 -> 17, but 5 -> 2 -> 8, 13 -> 4 -> 16).
CROP_FRAME_STEP = 8


@dataclass
class ToyVAETraining:
    """Settings of one VAE training run; :meth:`validate` checks them all at once."""

    steps: int = 3000
    batch_size: int = 8
    lr: float = 1e-3
    warmup_steps: int = 200
    min_lr_ratio: float = 0.05  # cosine decay to this fraction of lr
    grad_clip: float = 1.0
    l1_weight: float = 1.0
    mse_weight: float = 1.0
    kl_weight: float = 1e-6
    seed: int = 0
    eval_every: int = 250
    eval_clips: int = 64  # held-out clips scored during training (all of them at the end)
    eval_batch_size: int = 8
    flip: bool = True  # mirrored clips: cartoon scenes read the same both ways
    # Random crops for training (0: the whole clip): the VAE is convolutional and causal in time, so a
    # crop is a smaller clip of the same kind, for a fraction of the compute. Scores are always on whole
    # clips (the CPU prototype trained on 9x32x32 crops and was scored on 17x64x96 clips).
    crop_frames: int = 0  # 8k + 1 (see CROP_FRAME_STEP)
    crop_height: int = 0
    crop_width: int = 0
    val_fraction: float = 0.2
    device: str = "cpu"
    # Wall-clock budget of the training loop (0: none): training stops after the step that reaches it,
    # and the learning-rate decay follows whichever of steps and seconds runs out first.
    max_seconds: float = 0.0

    def validate(self) -> None:
        problems = [f"{name} must be >= {low}, got {getattr(self, name)}" for name, low in (
            ("steps", 0), ("batch_size", 1), ("warmup_steps", 0), ("eval_every", 1), ("eval_clips", 1),
            ("eval_batch_size", 1), ("l1_weight", 0), ("mse_weight", 0), ("kl_weight", 0), ("grad_clip", 0),
            ("crop_frames", 0), ("crop_height", 0), ("crop_width", 0), ("max_seconds", 0))
            if getattr(self, name) < low]
        if self.crop_frames and (self.crop_frames - 1) % CROP_FRAME_STEP:
            problems.append(f"crop_frames must be {CROP_FRAME_STEP}k + 1 (or 0), got {self.crop_frames}")
        if not self.lr > 0:
            problems.append(f"lr must be > 0, got {self.lr}")
        if not 0 <= self.min_lr_ratio <= 1:
            problems.append(f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if not 0 < self.val_fraction < 1:
            problems.append(f"val_fraction must be in (0, 1), got {self.val_fraction}")
        if self.l1_weight + self.mse_weight <= 0:
            problems.append("l1_weight + mse_weight must be > 0: nothing would be reconstructed")
        if problems:
            raise ValueError("VAE training settings: " + "; ".join(problems))

    @property
    def weights(self) -> LossWeights:
        return LossWeights(l1=self.l1_weight, mse=self.mse_weight, kl=self.kl_weight)


@dataclass
class Clips:
    """uint8 clips (N, T, H, W, 3) of one split, with their keys."""

    video: torch.Tensor
    keys: list[str]


def load_clips(pipeline_output: str | Path, val_fraction: float) -> tuple[Clips, Clips]:
    """(training clips, held-out clips) of ``pipeline_output/clips``, split by whole shots."""
    split = HeldOut(pipeline_output, CLIPS_DIR, val_fraction)
    parts: dict[bool, tuple[list[torch.Tensor], list[str]]] = {False: ([], []), True: ([], [])}
    for sample in iter_samples(folder_shards(Path(pipeline_output) / CLIPS_DIR)):
        videos, keys = parts[split.clip(sample["__key__"])]
        videos.append(torch.from_numpy(sample["mp4"]))
        keys.append(sample["__key__"])
    folder = Path(pipeline_output) / CLIPS_DIR
    for held, name in ((False, "training"), (True, "held-out")):
        if not parts[held][0]:
            raise ValueError(f"{folder}: no {name} clip at val_fraction={val_fraction}; more films or shots needed")
    train, held_out = (Clips(torch.stack(parts[h][0]), parts[h][1]) for h in (False, True))
    logger.info("VAE data: %d training and %d held-out clips of %s from %s",
                len(train.keys), len(held_out.keys), tuple(train.video.shape[1:]), folder)
    return train, held_out


def lr_at(step: int, run: ToyVAETraining, elapsed: float = 0.0) -> float:
    """Linear warm-up, then cosine decay to ``min_lr_ratio * lr`` at the last step, or at ``max_seconds``
    of training when that comes first (``elapsed``: seconds so far)."""
    if step < run.warmup_steps:
        return run.lr * (step + 1) / run.warmup_steps
    by_steps = (step - run.warmup_steps) / max(1, run.steps - run.warmup_steps)
    by_time = elapsed / run.max_seconds if run.max_seconds > 0 else 0.0
    progress = min(1.0, max(by_steps, by_time))
    return run.lr * (run.min_lr_ratio + (1 - run.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def _batches(video: torch.Tensor, size: int):
    for start in range(0, len(video), size):
        yield video[start:start + size]


def held_out_psnr(model: torch.nn.Module, video: torch.Tensor, batch_size: int, device: torch.device) -> torch.Tensor:
    """Per-clip PSNR of the posterior-mode reconstruction (the model is left in the mode it was in)."""
    was_training = model.training
    model.eval()
    scores = [psnr(batch, reconstruct(model, batch.to(device)).cpu()) for batch in _batches(video, batch_size)]
    model.train(was_training)
    return torch.cat(scores)


def scaling_factor(model: torch.nn.Module, video: torch.Tensor, batch_size: int,
                   device: torch.device) -> dict[str, float]:
    """1 / std of the posterior-mode latents of ``video`` (and their mean and std)."""
    was_training = model.training
    model.eval()
    sums = torch.zeros(2, dtype=torch.float64)
    count = torch.zeros((), dtype=torch.float64)
    for batch in _batches(video, batch_size):
        batch_sums, batch_count = latent_moments(model, batch.to(device))
        sums += batch_sums.cpu()
        count += batch_count
    model.train(was_training)
    mean = float(sums[0] / count)
    std = math.sqrt(max(float(sums[1] / count) - mean**2, 0.0))
    if not std > 0:
        raise RuntimeError("the trained VAE's latents have zero spread; the run diverged or collapsed")
    return {"scaling_factor": 1.0 / std, "latent_mean": mean, "latent_std": std}


def _crop_start(full: int, crop: int, generator: torch.Generator, what: str) -> tuple[int, int]:
    if not crop:
        return 0, full
    if crop > full:
        raise ValueError(f"crop_{what} {crop} is larger than the clips' {full}")
    start = int(torch.randint(full - crop + 1, (1,), generator=generator))
    return start, start + crop


def _augment(video: torch.Tensor, generator: torch.Generator, run: ToyVAETraining) -> torch.Tensor:
    """One random crop for the whole batch (the crop sizes of ``run``), then a mirror per clip."""
    _, frames, height, width, _ = video.shape
    t0, t1 = _crop_start(frames, run.crop_frames, generator, "frames")
    y0, y1 = _crop_start(height, run.crop_height, generator, "height")
    x0, x1 = _crop_start(width, run.crop_width, generator, "width")
    video = video[:, t0:t1, y0:y1, x0:x1]
    if not run.flip:
        return video
    mirrored = torch.rand(len(video), generator=generator) < 0.5
    return torch.where(mirrored.view(-1, 1, 1, 1, 1), video.flip(FRAME_AXIS_W), video)


def weights_file(folder: str | Path) -> Path:
    """The safetensors weights of a VAE folder written by :func:`save_vae` (never sharded at these sizes)."""
    from diffusers.utils import SAFETENSORS_WEIGHTS_NAME

    return Path(folder) / SAFETENSORS_WEIGHTS_NAME


def initial_vae(vae_cfg: VAEConfig, encoder_seed: int = 0, init: str | Path | None = None) -> torch.nn.Module:
    """The model a run starts from: the random build of ``vae_cfg`` (seed ``encoder_seed``), with the weights
    of the trained folder ``init`` loaded into it when given (checked first by :func:`init_link`)."""
    from safetensors.torch import load_file

    model = trainable_vae(vae_cfg, seed=encoder_seed)
    if init is not None:
        model.load_state_dict(load_file(weights_file(init)), strict=True)
        logger.info("VAE: starting from the weights of %s", init)
    return model


def train_vae(vae_cfg: VAEConfig, train: Clips, held_out: Clips, run: ToyVAETraining, encoder_seed: int = 0,
              on_eval: Callable[[dict[str, float]], None] | None = None,
              init: str | Path | None = None, first_draw: int = 0) -> tuple[torch.nn.Module, dict[str, Any]]:
    """Train from the random build of ``vae_cfg`` (seed ``encoder_seed``), or from the trained folder ``init``
    (a warm restart: the optimiser and the schedule start afresh); returns the model and the record
    (curve, final held-out and training PSNR, latent statistics, seconds). Step ``i`` draws its batch,
    augmentation and noise as step ``first_draw + i`` of the seed's stream, so a stage that continues a chain
    (``first_draw``: the chain's steps so far) draws new batches rather than the first stage's again."""
    run.validate()
    spatial = 2 ** (len(vae_cfg.block_out_channels) - 1)
    for name in ("crop_height", "crop_width"):
        if getattr(run, name) % spatial:
            raise ValueError(f"{name} must be a multiple of the VAE's spatial compression {spatial}, "
                             f"got {getattr(run, name)}")
    device = torch.device(run.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    model = initial_vae(vae_cfg, encoder_seed, init).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=run.lr, betas=(0.9, 0.99), weight_decay=0.0)
    eval_video = held_out.video[: run.eval_clips]
    curve: list[dict[str, float]] = []
    started = time.perf_counter()
    step = 0
    for step in range(run.steps):
        elapsed = time.perf_counter() - started
        generator = step_generator(run.seed, first_draw + step, 0)
        index = torch.randint(len(train.video), (run.batch_size,), generator=generator)
        video = _augment(train.video[index], generator, run).to(device)
        noise = torch.Generator(device=device).manual_seed(step_seed(run.seed + 1, first_draw + step, 0))
        parts = reconstruction_loss(model, video, run.weights, noise)
        optimizer.zero_grad(set_to_none=True)
        parts["loss"].backward()
        if run.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), run.grad_clip)
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, run, elapsed)
        optimizer.step()
        if (step + 1) % LOG_EVERY_N_STEPS == 0:
            logger.info("step %d: loss %.4f l1 %.4f mse %.5f kl %.2f lr %.2e", step + 1, *(
                float(parts[k].detach()) for k in ("loss", "l1", "mse", "kl")), lr_at(step, run, elapsed))
        out_of_time = run.max_seconds > 0 and time.perf_counter() - started >= run.max_seconds
        if (step + 1) % run.eval_every == 0 or step + 1 == run.steps or out_of_time:
            point = {"step": step + 1, "seconds": time.perf_counter() - started, "l1": float(parts["l1"]),
                     "held_out_psnr": float(held_out_psnr(model, eval_video, run.eval_batch_size, device).mean())}
            curve.append(point)
            logger.info("step %d: held-out PSNR %.2f dB on %d clips (%.0f s)", point["step"],
                        point["held_out_psnr"], len(eval_video), point["seconds"])
            if on_eval is not None:
                on_eval(point)
        if out_of_time:
            logger.info("stopping at step %d: max_seconds=%g reached", step + 1, run.max_seconds)
            break
    seconds = time.perf_counter() - started
    model.eval()
    held = held_out_psnr(model, held_out.video, run.eval_batch_size, device)
    trained = held_out_psnr(model, train.video[: len(held_out.video)], run.eval_batch_size, device)
    record = {
        "held_out_psnr": float(held.mean()), "held_out_psnr_min": float(held.min()),
        "train_psnr": float(trained.mean()), "held_out_clips": len(held_out.keys), "train_clips": len(train.keys),
        "train_seconds": seconds, "steps_done": step + 1 if run.steps else 0, "curve": curve,
        **scaling_factor(model, train.video[:SCALE_CLIPS], run.eval_batch_size, device),
    }
    return model, record


def save_vae(model: torch.nn.Module, out: str | Path, record: dict[str, Any]) -> Path:
    """Write the diffusers folder (atomically) with the measured scaling factor and ``training.json``;
    ``record`` gains ``weights_sha256``, the digest a later stage started from this folder names it by."""
    model.register_to_config(scaling_factor=record["scaling_factor"])
    out = Path(out)
    with atomic_dir(out) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        record["weights_sha256"] = sha256_file(weights_file(tmp))
        write_json_atomic(tmp / TRAINING_RECORD, record)
    return out


def check_saved(out: str | Path, held_out: Clips, batch_size: int, device: str) -> float:
    """Held-out PSNR through the frozen-encoder loader (``model.encoders.vae.path=out``)."""
    vae = FrozenVAE(VAEConfig(path=str(out))).to(device)
    scores = []
    for batch in _batches(held_out.video, batch_size):
        decoded = vae.decode(vae.encode(batch.to(device)))  # float [0, 1]
        scores.append(psnr(batch, (decoded * 255.0).round().to(torch.uint8).cpu()))
    return float(torch.cat(scores).mean())


def vae_config(model: str, overrides: Sequence[str]) -> tuple[VAEConfig, int]:
    """The preset's ``model.encoders.vae`` (with overrides) and its random-build seed."""
    cfg = compose_config("train", [f"model={model}", *overrides])
    vae = OmegaConf.to_object(cfg.model.encoders.vae)
    if vae.path:
        raise ValueError(f"model.encoders.vae.path is set ({vae.path!r}): the VAE to train starts from a random "
                         f"build of the preset's sizes; leave the path empty")
    return vae, int(cfg.model.encoders.seed)


def init_link(init: str | Path, vae_cfg: VAEConfig, out: str | Path | None = None,
              option: str = "--init") -> dict[str, Any]:
    """The identity of the trained folder ``init`` a stage starts from: the sha256 of its weights, its
    held-out PSNR, its steps over its own chain and its own ``init`` (None for a first stage), so a chain
    names every link. Refused (a user error naming the folder, after ``option``: how the command names it)
    when ``init`` is ``out`` itself (where an output folder is given), is not a folder this module trained,
    or was trained with another VAE config."""
    folder = Path(init)
    if out is not None and folder.resolve() == Path(out).resolve():
        raise InvalidInputError(f"{option} {folder}: that is the output folder itself; a stage starts from an "
                                f"earlier stage's folder and writes a new one")
    if not folder.is_dir():
        raise MissingInputError(f"{option} {folder}: no such folder")
    record_path, weights = folder / TRAINING_RECORD, weights_file(folder)
    missing = [p.name for p in (record_path, weights) if not p.is_file()]
    if missing:
        raise MissingInputError(f"{option} {folder}: not a trained VAE folder (no {' or '.join(missing)})")
    try:
        record = read_json(record_path)
    except ValueError as error:
        raise InvalidInputError(f"{option} {folder}: {TRAINING_RECORD} is not JSON ({error})") from None
    lacking = [k for k in ("held_out_psnr", "vae") if not isinstance(record, dict) or k not in record]
    if lacking:
        raise InvalidInputError(f"{option} {folder}: not a trained VAE folder ({TRAINING_RECORD} has no "
                                f"{', '.join(lacking)})")
    wanted = asdict(vae_cfg)
    differ = sorted(k for k in {*wanted, *record["vae"]} if record["vae"].get(k) != wanted.get(k))
    if differ:
        raise InvalidInputError(f"{option} {folder}: trained with another VAE config ("
                                + ", ".join(f"{k}: {record['vae'].get(k)!r}, here {wanted.get(k)!r}" for k in differ)
                                + ")")
    digest = sha256_file(weights)
    if record.get("weights_sha256", digest) != digest:
        raise InvalidInputError(f"{option} {folder}: {weights.name} is not the file its {TRAINING_RECORD} records "
                                f"(sha256 {digest}, recorded {record['weights_sha256']})")
    return {"weights_sha256": digest, "held_out_psnr": record["held_out_psnr"],
            "total_steps": record.get("total_steps", record.get("steps_done", 0)), "init": record.get("init")}


def train_and_save(out: str | Path, data: str | Path, vae_cfg: VAEConfig, encoder_seed: int,
                   run_cfg: ToyVAETraining, about: dict[str, Any] | None = None,
                   init: str | Path | None = None) -> dict[str, Any]:
    """Train on ``data``'s training clips (from the trained folder ``init`` when given), write ``out``,
    score it again through the frozen loader; returns the record written to ``out/training.json``
    (``about`` is added to it as is)."""
    run_cfg.validate()
    link = None if init is None else init_link(init, vae_cfg, out)
    train, held_out = load_clips(data, run_cfg.val_fraction)
    trained, record = train_vae(vae_cfg, train, held_out, run_cfg, encoder_seed=encoder_seed, init=init,
                                first_draw=link["total_steps"] if link else 0)
    record.update({**(about or {}), **_identity(data, vae_cfg, encoder_seed, run_cfg, link),
                   "total_steps": record["steps_done"] + (link["total_steps"] if link else 0),
                   "init_folder": None if init is None else str(Path(init).resolve()),
                   "data": str(Path(data).resolve()), "clip_shape": list(train.video.shape[1:])})
    save_vae(trained, out, record)
    record["loaded_held_out_psnr"] = check_saved(out, held_out, run_cfg.eval_batch_size, run_cfg.device)
    write_json_atomic(Path(out) / TRAINING_RECORD, record)
    logger.info("VAE -> %s: held-out PSNR %.2f dB (loaded again: %.2f dB), training clips %.2f dB, scaling "
                "factor %.4f, %.0f s", out, record["held_out_psnr"], record["loaded_held_out_psnr"],
                record["train_psnr"], record["scaling_factor"], record["train_seconds"])
    return record


def _identity(data: str | Path, vae_cfg: VAEConfig, encoder_seed: int, run_cfg: ToyVAETraining,
              init: dict[str, Any] | None = None) -> dict[str, Any]:
    """What a trained folder was made from: the clips (a digest of their content), sizes, settings and the
    :func:`init_link` of the folder it started from (None: the random build). The clips' and the init's
    folders are left out (the record keeps them for information), and so are the paths the manifest
    records: a folder carried to another machine, data moved, or the same films cut again in another
    folder must still be reused."""
    return {"clip_content_sha256": clip_content_sha256(data, CLIPS_DIR),
            "vae": asdict(vae_cfg), "encoder_seed": encoder_seed, "settings": asdict(run_cfg), "init": init}


def ensure_trained(out: str | Path, data: str | Path, vae_cfg: VAEConfig, encoder_seed: int,
                   run_cfg: ToyVAETraining, about: dict[str, Any] | None = None,
                   init: str | Path | None = None) -> dict[str, Any]:
    """``out``'s record when it was trained from the same clips, sizes, settings and ``init`` weights (a
    recipe run again reuses its VAE); otherwise train it (again)."""
    link = None if init is None else init_link(init, vae_cfg, out)
    record = read_json_if_exists(Path(out) / TRAINING_RECORD)
    wanted = _identity(data, vae_cfg, encoder_seed, run_cfg, link)
    if record is not None and all(record.get(key) == value for key, value in wanted.items()):
        logger.info("VAE %s: trained from the same clips and settings; reused (held-out PSNR %.2f dB)",
                    out, record["held_out_psnr"])
        return record
    return train_and_save(out, data, vae_cfg, encoder_seed, run_cfg, about, init)


def run(out: str | Path, data: str | Path, model: str, run_cfg: ToyVAETraining,
        overrides: Sequence[str] = (), init: str | Path | None = None) -> dict[str, Any]:
    """The command: the VAE of preset ``model`` (with ``overrides``) trained on ``data`` (from the trained
    folder ``init`` when given), or reused. Its settings and device are checked before anything is read."""
    try:
        run_cfg.validate()
    except ValueError as error:  # the command's own options (each field is the option of that name)
        raise UserError(str(error)) from None
    problems = device_problems(run_cfg.device, f"--device {run_cfg.device}", "--device cpu")
    if not (Path(data) / CLIPS_DIR).is_dir():
        problems.append(f"--data {data}: not a pipeline output folder (no {CLIPS_DIR}/ in it)")
    if problems:
        raise UserError("; ".join(problems))
    vae_cfg, seed = vae_config(model, overrides)
    return ensure_trained(out, data, vae_cfg, seed, run_cfg, {"model": model, "overrides": list(overrides)}, init)


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    defaults = ToyVAETraining()
    parser = argparse.ArgumentParser(prog="python -m animegamer.toy_vae", description=doc_summary(__doc__))
    parser.add_argument("out", type=Path, help="VAE folder to write (diffusers format)")
    parser.add_argument("--data", type=Path, required=True, help="pipeline output folder holding clips/")
    parser.add_argument("--model", default="tiny", help="model preset whose model.encoders.vae is trained")
    parser.add_argument("--init", type=Path, default=None, metavar="FOLDER",
                        help="start from the weights of an earlier run's VAE folder (the same preset's VAE "
                             "config): a warm restart, not a resume; the optimiser, warm-up and cosine decay "
                             "start afresh over this run's --steps / --max-seconds")
    for name, value in asdict(defaults).items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=value)
        else:
            parser.add_argument(flag, type=type(value), default=value)
    parser.add_argument("overrides", nargs="*", help="config overrides, e.g. model.encoders.vae.latent_channels=16")
    return parser.parse_intermixed_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse_args(argv)
    setup_logging("INFO")
    settings = ToyVAETraining(**{name: getattr(args, name) for name in asdict(ToyVAETraining())})
    exit_on_user_error(run)(args.out, args.data, args.model, settings, args.overrides, args.init)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
