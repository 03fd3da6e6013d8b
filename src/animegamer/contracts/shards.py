"""What the samples of each shard folder hold (see docs/architecture.md, 'Shard contracts'): the member
names the pipeline writes and every reader reads, and the key a reader adds for the samples it skipped."""
from __future__ import annotations

JSON = "json"  # every sample's record
MP4 = "mp4"  # clip shards: the clip
NPY_SUFFIX = ".npy"  # arrays, read with allow_pickle=False
LATENTS = "latents.npy"  # feature and adaptation shards: VAE latents (T', C, H', W')
TEXT = "text.npy"  # feature shards: T5's hidden states of the motion text (L_text, text_dim)
IMAGE = "image.npy"  # feature shards: CLIP's patch tokens of the first frame (P, image_dim)
REP = "rep.npy"  # representation shards: the encoder's output (N, D)
REPS = "reps.npy"  # session shards: each turn's representation (K, N, D)
PRED_REP = "pred_rep.npy"  # adaptation shards: the frozen MLLM's prediction (N, D)
SKIPPED = "__skipped__"  # an item's (and a batch's) records of the samples skipped as unreadable
