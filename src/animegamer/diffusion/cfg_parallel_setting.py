"""The values of ``model.decoder.cfg_parallel``, apart from the two-device guidance that runs them
(:mod:`animegamer.diffusion.cfg_parallel`): the step cache's check reads them, and the sampler, on
which the two-device guidance builds, uses the step cache."""
from __future__ import annotations

CFG_PARALLEL_AUTO, CFG_PARALLEL_ON, CFG_PARALLEL_OFF = "auto", "on", "off"
CFG_PARALLEL_CHOICES = (CFG_PARALLEL_AUTO, CFG_PARALLEL_ON, CFG_PARALLEL_OFF)
KEY = "model.decoder.cfg_parallel"
