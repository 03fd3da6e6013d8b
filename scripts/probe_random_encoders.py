"""Do random-weight frozen encoders still carry what the game needs? A nearest-neighbour probe.

    .venv/bin/python scripts/probe_random_encoders.py PIPELINE_OUTPUT [--model tiny] [--val-fraction 0.2]
        [override ...]

The phase (a) encoder reads CLIP patch tokens of a clip's first frame and T5 features of its motion
text; with random weights those are fixed random feature maps. A map is good enough when what the
game must tell apart stays apart in it. For every held-out clip of ``PIPELINE_OUTPUT/clips`` (split by
whole shots, as training does) this finds the nearest training clip (cosine distance of the flattened
features) and scores whether it has the same characters, the same main character, the same number of
characters (the SC rule) and the same environment (the ET rule); a linear probe (ridge classifier fitted
on the training clips) asks the same of held-out clips. The same probes on the raw first-frame pixels at
CLIP's input size (what the random CLIP sees) and the majority class give the reference points.

For T5 it reports the smallest distance between the features of two different motion texts, their mean
norm, and the largest difference between two encodings of the same text in another batch order (zero:
the map is deterministic): whether every motion level gets its own, stable condition. Prints one JSON
object.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf

from animegamer.config.compose import compose_config
from animegamer.data.shards import folder_shards, iter_samples
from animegamer.data.split import HeldOut
from animegamer.models.frozen_encoders import build_frozen_encoders
from animegamer.utils.text import doc_summary
from data_pipeline.toyfilm import CHARACTER_JOINER

CLIPS_DIR = "clips"
LABELS = ("characters", "main_character", "character_count", "environment")


def labels_of(meta: dict) -> dict[str, str]:
    names = meta["caption"]["character"].split(CHARACTER_JOINER)
    return {"characters": " & ".join(sorted(names)), "main_character": names[0],
            "character_count": str(len(names)), "environment": meta["caption"]["environment"]}


def nearest_neighbour_accuracy(train: np.ndarray, held: np.ndarray, train_labels: list[dict],
                               held_labels: list[dict]) -> dict[str, float]:
    """Share of held-out rows whose nearest training row (cosine) has the same label, per label."""
    a = train / np.linalg.norm(train, axis=1, keepdims=True)
    b = held / np.linalg.norm(held, axis=1, keepdims=True)
    nearest = np.argmax(b @ a.T, axis=1)
    return {name: float(np.mean([train_labels[j][name] == held_labels[i][name] for i, j in enumerate(nearest)]))
            for name in LABELS}


def linear_probe_accuracy(train: np.ndarray, held: np.ndarray, train_labels: list[dict],
                          held_labels: list[dict], ridge: float = 1.0) -> dict[str, float]:
    """Held-out accuracy of a ridge-regression classifier (one-vs-rest on standardised features,
    closed form in the dual, as features outnumber clips) fitted on the training clips, per label."""
    mean, std = train.mean(axis=0), train.std(axis=0) + 1e-6
    a, b = (train - mean) / std, (held - mean) / std
    gram = a @ a.T + ridge * len(a) * np.eye(len(a))
    out = {}
    for name in LABELS:
        classes = sorted({t[name] for t in train_labels})
        targets = np.array([[t[name] == c for c in classes] for t in train_labels], dtype=np.float64)
        scores = b @ (a.T @ np.linalg.solve(gram, targets - targets.mean(axis=0)))
        predicted = [classes[i] for i in np.argmax(scores, axis=1)]
        out[name] = float(np.mean([p == h[name] for p, h in zip(predicted, held_labels)]))
    return out


def majority_accuracy(train_labels: list[dict], held_labels: list[dict]) -> dict[str, float]:
    out = {}
    for name in LABELS:
        majority = Counter(t[name] for t in train_labels).most_common(1)[0][0]
        out[name] = float(np.mean([h[name] == majority for h in held_labels]))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=doc_summary(__doc__))
    parser.add_argument("data", type=Path, help="pipeline output folder holding clips/")
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--val-fraction", type=float, default=0.2)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_intermixed_args(argv)

    cfg = compose_config("train", [f"model={args.model}", *args.overrides])
    encoders_cfg = OmegaConf.to_object(cfg.model.encoders)
    encoders = build_frozen_encoders(encoders_cfg, which=("clip", "t5"))
    split = HeldOut(args.data, CLIPS_DIR, args.val_fraction)
    frames, metas, held = [], [], []
    for sample in iter_samples(folder_shards(args.data / CLIPS_DIR)):
        frames.append(sample["mp4"][0])
        metas.append(sample["json"])
        held.append(split.clip(sample["__key__"]))
    first = np.stack(frames)  # (N, H, W, 3) uint8
    held_mask = np.array(held)
    labels = [labels_of(m) for m in metas]
    train_labels = [l for l, h in zip(labels, held) if not h]
    held_labels = [l for l, h in zip(labels, held) if h]

    with torch.no_grad():
        clip_tokens = torch.cat([encoders.clip.encode(torch.from_numpy(first[i:i + 64]))
                                 for i in range(0, len(first), 64)]).flatten(1).numpy()
        pixels = encoders.clip.preprocess(torch.from_numpy(first)).flatten(1).numpy()  # what CLIP sees
    texts = sorted({m["motion_text"] for m in metas})
    with torch.no_grad():
        t5 = encoders.t5.encode(texts).flatten(1).numpy()
        t5_again = encoders.t5.encode(list(reversed(texts))).flatten(1).numpy()[::-1]
    distances = np.linalg.norm(t5[:, None] - t5[None], axis=-1)
    off_diagonal = distances[~np.eye(len(texts), dtype=bool)]

    result = {
        "data": str(args.data), "model": args.model, "train_clips": int((~held_mask).sum()),
        "held_out_clips": int(held_mask.sum()),
        "clip": {"input_size": encoders.clip.image_size, "tokens": encoders.clip.num_patches,
                 "hidden": encoders.clip.hidden_size},
        "nearest_neighbour": {
            "random_clip_tokens": nearest_neighbour_accuracy(clip_tokens[~held_mask], clip_tokens[held_mask],
                                                             train_labels, held_labels),
            "clip_input_pixels": nearest_neighbour_accuracy(pixels[~held_mask], pixels[held_mask],
                                                            train_labels, held_labels),
            "majority_class": majority_accuracy(train_labels, held_labels),
        },
        "linear_probe": {
            "random_clip_tokens": linear_probe_accuracy(clip_tokens[~held_mask], clip_tokens[held_mask],
                                                        train_labels, held_labels),
            "clip_input_pixels": linear_probe_accuracy(pixels[~held_mask], pixels[held_mask],
                                                       train_labels, held_labels),
        },
        "t5": {"texts": texts, "min_distance_between_texts": float(off_diagonal.min()),
               "mean_feature_norm": float(np.linalg.norm(t5, axis=1).mean()),
               "max_repeat_difference": float(np.abs(t5 - t5_again).max())},
    }
    json.dump(result, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
