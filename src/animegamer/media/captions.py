"""A clip's caption status, as the clip shards record it (``captioner.status``): only an ``ok`` clip
carries a caption, states and an instruction."""
from __future__ import annotations

STATUS_OK = "ok"
STATUS_FAILED = "failed"
