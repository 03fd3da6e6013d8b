"""scripts/register_checkout.py: a checkout run from its folders (a GPU host's PYTHONPATH) finds the entry
points an install would record, the data pipeline's among them."""
from __future__ import annotations

import configparser
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_checkouts_entry_points_are_found_without_an_install(tmp_path):
    subprocess.run([sys.executable, str(ROOT / "scripts" / "register_checkout.py"), str(tmp_path)], check=True,
                   capture_output=True)
    # -S: no site-packages, so this environment's own install of the project cannot answer.
    probe = ("import importlib.metadata as m; "
             "print('\\n'.join(f'{e.group} {e.name} {e.value}' for g in ('animegamer.pipeline', 'animegamer.commands')"
             " for e in m.entry_points(group=g)))")
    found = subprocess.run([sys.executable, "-S", "-c", probe], capture_output=True, text=True, check=True,
                           env={"PYTHONPATH": str(tmp_path)}).stdout.splitlines()
    cfg = configparser.ConfigParser(interpolation=None)
    cfg.read(ROOT / "setup.cfg")
    wanted = [f"{group} {key.strip()} {value.strip()}" for group in ("animegamer.pipeline", "animegamer.commands")
              for key, _, value in (line.partition("=") for line in cfg["options.entry_points"][group].splitlines())
              if value and not key.strip().startswith("#")]
    assert "animegamer.pipeline default data_pipeline.plugin:PIPELINE" in found
    assert sorted(found) == sorted(wanted) and len(wanted) >= 11
