"""Pipeline step names the library itself asks for (the whole list, in order, is the schema's
``PIPELINE_STEPS``)."""
from __future__ import annotations

CLIP_STEPS = ("process", "finalize")  # the steps that write the clip shards and their manifest
