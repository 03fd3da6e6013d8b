"""The game command's pre-flight: every missing or mismatched input, found before any model is built."""
from __future__ import annotations

import argparse
from pathlib import Path

from animegamer.checkpoints.export import export_folder_problems
from animegamer.checkpoints.export_checks import check_export_role, check_export_sizes
from animegamer.config.schema import RunConfig
from animegamer.contracts.files import MANIFEST
from animegamer.game.writer import GAME_FILE


def input_problems(args: argparse.Namespace, cfg: RunConfig) -> list[str]:
    """Every missing or mismatched input of the command line, found before any model is built."""
    problems = []
    if args.max_turns < 0 or args.window_turns < 0:
        problems.append(f"--max-turns {args.max_turns} / --window-turns {args.window_turns}: must be >= 0")
    exports = [("--mllm", args.mllm, "mllm")] if args.mllm else []
    exports += [("--renderer", folder, "renderer") for folder in args.renderer]
    for option, folder, role in exports:
        missing = export_folder_problems(f"{option} {folder}", folder, hint="train the phase first")
        problems += missing or check_export_role(option, folder, role) or check_export_sizes(option, folder, cfg.model)
    manifest = Path(args.clips_manifest)
    if not (manifest / MANIFEST if manifest.is_dir() else manifest).is_file():
        problems.append(f"--clips-manifest {manifest}: no such {MANIFEST} (run the pipeline first)")
    if args.instructions and not Path(args.instructions).is_file():
        problems.append(f"--instructions {args.instructions}: no such file")
    if (Path(args.out) / GAME_FILE).exists() and not args.overwrite:
        problems.append(f"--out {args.out} already holds a game ({GAME_FILE}); choose another folder or --overwrite")
    return problems
