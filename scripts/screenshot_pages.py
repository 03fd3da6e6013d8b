"""Screenshots of the quick start's pages (``eval/gallery.html`` and ``game/index.html``) in headless
Chromium, opened from another working directory, to see what a person sees.

    .venv/bin/python scripts/screenshot_pages.py [--root outputs/quickstart] [--out screenshots] [--in-place]

By default the ``eval`` and ``game`` folders are first copied to a temporary folder and the copies are
opened (the pages must not depend on where the run wrote them); ``--in-place`` opens the originals.
Chromium runs with a fresh profile and a temporary working directory. Needs a Chromium binary
(Debian: ``apt-get install chromium``); CI does not run this script.
"""
from __future__ import annotations

import argparse
import logging
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

log = logging.getLogger("screenshot_pages")

PAGES = {"gallery": Path("eval") / "gallery.html", "storyboard": Path("game") / "index.html"}
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars", "--mute-audio")
WINDOW = (1400, 1500)
LOAD_BUDGET_MS = 8000  # virtual time for the page, its posters and the videos' metadata to load
TIMEOUT_S = 120


def find_browser(name: str | None) -> str:
    for candidate in ([name] if name else BROWSERS):
        found = shutil.which(candidate)
        if found:
            return found
    raise SystemExit(f"error: no Chromium found ({name or ', '.join(BROWSERS)}); install it, e.g. "
                     "apt-get install -y chromium, or pass --chromium PATH")


def screenshot(browser: str, page: Path, png: Path, workdir: Path) -> None:
    """One headless Chromium run with a fresh profile, started in ``workdir``."""
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        command = [browser, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={WINDOW[0]},{WINDOW[1]}",
                   f"--virtual-time-budget={LOAD_BUDGET_MS}", f"--screenshot={png}", page.resolve().as_uri()]
        done = subprocess.run(command, cwd=workdir, capture_output=True, text=True, timeout=TIMEOUT_S)
    if done.returncode != 0 or not png.is_file():
        raise RuntimeError(f"{browser} failed on {page} (exit {done.returncode}):\n{done.stderr[-2000:]}")


def main(argv: list[str] | None = None) -> int:
    from animegamer.utils.logging import setup_logging

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=Path("outputs/quickstart"), help="the quick start's output folder")
    parser.add_argument("--out", type=Path, default=Path("screenshots"), help="where the PNGs go")
    parser.add_argument("--in-place", action="store_true", help="open the pages where they are (no copy)")
    parser.add_argument("--chromium", default=None, help="browser binary (default: the first Chromium on PATH)")
    args = parser.parse_args(argv)
    setup_logging("INFO")
    missing = [str(args.root / p) for p in PAGES.values() if not (args.root / p).is_file()]
    if missing:
        raise SystemExit(f"error: {', '.join(missing)}: missing; run .venv/bin/python -m animegamer.quickstart first")
    browser = find_browser(args.chromium)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="pages-") as scratch:
        scratch = Path(scratch)
        root = args.root
        if not args.in_place:
            root = scratch / "moved"
            for folder in {p.parts[0] for p in PAGES.values()}:
                shutil.copytree(args.root / folder, root / folder)
        workdir = scratch / "elsewhere"  # neither the repository nor the run's folder
        workdir.mkdir()
        for name, page in PAGES.items():
            png = args.out.resolve() / f"{name}.png"
            screenshot(browser, root / page, png, workdir)
            log.info("%s: %s (opened %s from %s)", name, png, root / page, workdir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
