"""The generic trainer runs without any phase (docs/architecture.md, 'Import rules': ``training`` is layer 6,
``phases`` layer 7): every module of ``animegamer.training``, imported in a fresh interpreter, loads no module
of ``animegamer.phases``; the phases layer hands the trainer what a phase's spec says (its FSDP wrapping
unit, the folder of its samples, whether its export writes a LoRA adapter) as arguments."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

TRAINING = Path(__file__).resolve().parents[1] / "src" / "animegamer" / "training"
PHASES = "animegamer.phases"


def test_importing_every_training_module_loads_no_phase():
    modules = sorted(f"animegamer.training.{path.stem}" for path in TRAINING.glob("*.py") if path.stem != "__init__")
    code = ("import importlib, sys\n"
            f"for name in {modules!r}:\n    importlib.import_module(name)\n"
            f"print(len({modules!r}), sorted(m for m in sys.modules if m.startswith({PHASES!r})))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split(maxsplit=1) == [str(len(modules)), "[]\n"]
    assert {"animegamer.training.strategies", "animegamer.training.run_record"} <= set(modules)
