"""Step caching while sampling: skip most of the decoder at steps where it would change little.

``model.diffusion.cache=first_block`` turns on diffusers' First Block Cache (``diffusers.hooks``) for one
:func:`~animegamer.diffusion.sampler.sample` call: at every step the decoder's first block runs; when its
residual (output minus input) moved less than ``model.diffusion.cache_threshold`` since the last step that
ran every block (mean absolute change over the mean absolute residual), the other blocks are skipped and
that step's residual of the remaining blocks is added instead. Off by default: the samples change, by an
amount ``benchmarks/step_cache.py`` measures against the uncached samples from the same noise.

What it does not keep:
- a batch decides together (one mean over every sample and both guidance branches): the game samples
  each turn of a batch of games (``evaluate.py``'s ``evaluation.batch_games``) alone, so a game still
  equals the same game played alone, and batching no longer speeds up sampling;
- the two-GPU guidance branches (``model.decoder.cfg_parallel``) would decide apart, each on its own
  branch, so the validation pass refuses the pair.

The hooks are registered for the call and removed after it: a decoder that trains between samples (phase
(c), reconstruction during validation) runs without them. With a compiled decoder (``model.decoder.compile``)
the hooked blocks are traced anew: on the CPU the tiny decoder's first cached sample compiled for ~11 s and
the first uncached call after one compiled again (thresholds 0 and uncached agreed within 1e-5); what that
costs a game on a GPU is for ``benchmarks/step_cache.py --compile whole`` and ``game_turn.py --cache``
(a 30-block tiny decoder so compiled stayed within dynamo's recompile limit on the CPU: 10 graphs).
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from torch import nn

from animegamer.config.validate import choice
from animegamer.diffusion.cfg_parallel_setting import CFG_PARALLEL_ON, KEY

CACHE_NONE = "none"
CACHE_FIRST_BLOCK = "first_block"
SAMPLING_CACHES = (CACHE_NONE, CACHE_FIRST_BLOCK)
# diffusers keeps one cache state per named context; the sampler runs both guidance branches as one call
CONTEXT = "guided_batch"


def check_sampling_cache(diffusion, decoder) -> list[str]:
    """``model.diffusion.cache`` and ``cache_threshold``, and the pair the cache cannot keep."""
    problems = choice("model.diffusion.cache", str(diffusion.cache), SAMPLING_CACHES)
    if not diffusion.cache_threshold >= 0:
        problems.append(f"model.diffusion.cache_threshold={diffusion.cache_threshold} must be >= 0")
    if str(diffusion.cache) == CACHE_FIRST_BLOCK and str(decoder.cfg_parallel) == CFG_PARALLEL_ON:
        problems.append(f"model.diffusion.cache={diffusion.cache} with {KEY}=on: the two GPUs' guidance branches "
                        f"would each decide alone which steps to skip; use {KEY}=auto (one GPU with the cache) "
                        f"or model.diffusion.cache=none")
    return problems


def caching(diffusion) -> bool:
    return str(diffusion.cache) != CACHE_NONE


def cached_transformer(denoise_fn: object) -> nn.Module:
    """The diffusers transformer the cache hooks into: the decoder's (``MotionScopeDecoder.transformer``)."""
    transformer = getattr(denoise_fn, "transformer", None)
    if not isinstance(transformer, nn.Module) or not hasattr(transformer, "enable_cache"):
        raise ValueError(f"model.diffusion.cache needs the decoder's diffusers transformer; "
                         f"{type(denoise_fn).__name__} has none (the two-GPU guidance branches are not supported)")
    return transformer


@contextmanager
def sampling_cache(denoise_fn: object, cache: str, threshold: float) -> Iterator[None]:
    """The cache on ``denoise_fn``'s transformer for the ``with`` body, with a fresh state; nothing when
    ``cache`` is ``none``."""
    if cache == CACHE_NONE:
        yield
        return
    if cache != CACHE_FIRST_BLOCK:
        raise ValueError(f"model.diffusion.cache={cache!r}: choose from {list(SAMPLING_CACHES)}")
    from diffusers import FirstBlockCacheConfig

    transformer = cached_transformer(denoise_fn)
    transformer.enable_cache(FirstBlockCacheConfig(threshold=threshold))
    try:
        with transformer.cache_context(CONTEXT):
            yield
    finally:
        transformer.disable_cache()
