"""Golden loss curves (tests/golden/*.json): recorded by running the code, compared step by step.

``ANIMEGAMER_UPDATE_GOLDEN=1`` rewrites the file from the run (with the command that does it and the
torch version) before comparing, so a deliberate change of the numbers is one command and a diff."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

GOLDEN_DIR = Path(__file__).parent / "golden"
UPDATE_GOLDEN = os.environ.get("ANIMEGAMER_UPDATE_GOLDEN") == "1"
REL_TOL = 1e-5


def check_golden_losses(name: str, losses: dict[int, float], command: str) -> None:
    """``losses`` (step -> loss) equal ``tests/golden/<name>.json``'s within ``REL_TOL``."""
    path = GOLDEN_DIR / f"{name}.json"
    if UPDATE_GOLDEN:
        path.write_text(json.dumps({"command": f"ANIMEGAMER_UPDATE_GOLDEN=1 {command}", "torch": torch.__version__,
                                    "losses": losses}, indent=2))
    golden = {int(k): v for k, v in json.loads(path.read_text())["losses"].items()}
    assert sorted(losses) == sorted(golden), (sorted(losses), sorted(golden))
    for step, value in golden.items():
        assert losses[step] == pytest.approx(value, rel=REL_TOL), (step, losses)
