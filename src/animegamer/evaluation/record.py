"""An evaluation folder's record (``evaluation_record.json``): what lets an unchanged evaluation be read back
instead of played again (:mod:`animegamer.evaluation.reuse` writes and reads it). Every evaluation played
into a folder forgets the record first (:func:`forget_record`), so a record never vouches for metrics that
another config overwrote.
"""
from __future__ import annotations

from pathlib import Path

RECORD_FILE = "evaluation_record.json"


def forget_record(out: Path) -> None:
    """Invalidate ``out``'s record: every evaluation played into ``out`` (``evaluate.py`` too) calls this
    first, so a later reuse never returns metrics another config overwrote."""
    (out / RECORD_FILE).unlink(missing_ok=True)
