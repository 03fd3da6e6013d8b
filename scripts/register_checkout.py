"""Register this checkout's entry points on a host that runs it from its source folders (PYTHONPATH) rather
than from an install: the recipes find the data pipeline, and ``animegamer`` its verbs, through the entry
points of setup.cfg, which only an install records.

    python3 scripts/register_checkout.py TARGET   # TARGET: a folder on PYTHONPATH, e.g. /tmp/site

Writes ``TARGET/<name>-<version>.dist-info`` with setup.cfg's metadata name and version and its
``[options.entry_points]``: Python's ``importlib.metadata`` reads a distribution from any folder on the path.
The code itself is still imported from the checkout's folders on PYTHONPATH. Needs the standard library only.
"""
from __future__ import annotations

import configparser
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(target: str) -> int:
    cfg = configparser.ConfigParser(interpolation=None)
    cfg.read(ROOT / "setup.cfg")
    name, version = cfg["metadata"]["name"], cfg["metadata"]["version"]
    groups = cfg["options.entry_points"]
    lines = []
    for group, body in groups.items():
        # setup.cfg's groups are "key = module:attr" lines; comments between them are configparser's to drop.
        entries = [line.strip() for line in body.splitlines() if line.strip() and not line.strip().startswith("#")]
        lines += [f"[{group}]", *entries, ""]
    folder = Path(target) / f"{re.sub(r'[-.]+', '_', name)}-{version}.dist-info"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (folder / "entry_points.txt").write_text("\n".join(lines))
    print(f"{folder}: the entry points of {ROOT / 'setup.cfg'} ({', '.join(groups)})")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1]))
