"""The parameter groups each phase trains, by name: what its spec's ``trains`` lists and its module resolves
to parameter names (:func:`animegamer.phases.denoising.trained_parameters`). Kept apart from the modules so
that the specs and the pre-flight read them without loading Lightning."""
from __future__ import annotations

from animegamer.contracts.exports import A_BASE, A_JOINT, A_WARMUP

# Parameter groups of the reconstruction model (encoder + decoder); a phase that trains the decoder's LoRA
# also adds it. DECODER is every parameter of the decoder's transformer (pre-training a base, no LoRA).
ENCODER, MOTION_SCOPE, ADALN, LORA, DECODER = "encoder", "motion_scope", "adaln", "lora", "decoder"

# Phase (b): the game-state MLLM's own trainable set (LoRA, and per model.mllm its norms and embeddings, the
# projections).
MLLM = "mllm"

# Phase (a)'s stage -> the groups it trains.
STAGE_GROUPS = {
    # The whole decoder and the encoder, the stand-in of CogVideoX's text-to-video pre-training (the
    # encoder plays the text encoder and is discarded).
    A_BASE: (ENCODER, DECODER),
    # Encoder branches and the motion-scope embedder; the decoder stays as loaded (LoRA merged).
    A_WARMUP: (ENCODER, MOTION_SCOPE),
    # + the decoder's LoRA and every block's AdaLN modulation linear.
    A_JOINT: (ENCODER, MOTION_SCOPE, ADALN, LORA),
}

# Phase (c): the decoder's motion scope, AdaLN and LoRA; the encoder stays as phase (a) left it.
ADAPTATION_GROUPS = (MOTION_SCOPE, ADALN, LORA)
