"""A pickled payload that proves whether a loader ran code from a file, for the safe-loading tests."""
from __future__ import annotations

from pathlib import Path

import pytest

REFUSED_PICKLE = "refused: it does not load as weights only"


class Evil:
    """Unpickling this object opens (creates) ``marker``: code from the file would have run."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.fixture
def marker(tmp_path) -> Path:
    path = tmp_path / "pwned"
    yield path
    assert not path.exists(), "the pickled payload was executed"
