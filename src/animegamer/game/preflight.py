"""The game command's pre-flight: every missing or mismatched input, found before any model is built."""
from __future__ import annotations

import argparse
from pathlib import Path

from animegamer.checkpoints.export import export_folder_problems
from animegamer.checkpoints.export_checks import check_export_role, check_export_sizes
from animegamer.config.schema import RunConfig
from animegamer.config.validate import device_problems
from animegamer.contracts.files import MANIFEST
from animegamer.errors import UserError
from animegamer.game.instructions import read_instructions
from animegamer.game.writer import GAME_FILE, unfinished_game
from animegamer.utils.io import out_dir_problem


def resume_problems(args: argparse.Namespace, earlier: dict) -> list[str]:
    """An unfinished game in --out is resumed by the same command: its instruction file must still begin
    with the instructions already played."""
    if not args.instructions or not Path(args.instructions).is_file():
        return []
    played = [turn["instruction"] for turn in earlier["turns"]]
    try:
        script = read_instructions(args.instructions)
    except UserError:
        return []  # said by the instruction file's own check
    if script[:len(played)] == played:
        return []
    first = next((i for i, (a, b) in enumerate(zip(played, script)) if a != b), min(len(played), len(script)))
    return [f"--out {args.out} holds an unfinished game whose turn {first} was {played[first]!r}, where "
            f"{args.instructions} now has {script[first] if first < len(script) else 'no such line'!r}: resume it "
            f"with its own instructions, choose another folder, or start it again (--overwrite)"]


def input_problems(args: argparse.Namespace, cfg: RunConfig) -> list[str]:
    """Every missing or mismatched input of the command line, found before any model is built."""
    problems = []
    if args.max_turns < 0:
        problems.append(f"--max-turns {args.max_turns}: must be >= 0 (0: play every instruction)")
    if args.window_turns is not None and args.window_turns < 1:
        problems.append(f"--window-turns {args.window_turns}: must be >= 1, the new turn included (leave it out "
                        f"for K, the {len(cfg.data.window_weights)} window lengths phase (b) trained on)")
    if args.sampling_steps is not None and args.sampling_steps < 1:
        problems.append(f"--sampling-steps {args.sampling_steps}: must be >= 1 (leave it out for "
                        f"model.diffusion.sampling_steps, {cfg.model.diffusion.sampling_steps})")
    if not args.mllm and not cfg.model.mllm.official_checkpoint:
        problems.append("--mllm: no MLLM weights; give a phase (b) export folder (--mllm DIR) or set "
                        "model.mllm.official_checkpoint")
    if not args.renderer and not cfg.model.decoder.official_checkpoint:
        problems.append("--renderer: no renderer weights; give a phase (c) or (a) export folder (--renderer DIR) or "
                        "set model.decoder.official_checkpoint")
    exports = [("--mllm", args.mllm, "mllm")] if args.mllm else []
    exports += [("--renderer", folder, "renderer") for folder in args.renderer]
    for option, folder, role in exports:
        missing = export_folder_problems(f"{option} {folder}", folder, hint="train the phase first")
        problems += missing or check_export_role(option, folder, role) or check_export_sizes(option, folder, cfg.model)
    manifest = Path(args.clips_manifest)
    if not (manifest / MANIFEST if manifest.is_dir() else manifest).is_file():
        problems.append(f"--clips-manifest {manifest}: no such {MANIFEST} (run the pipeline first)")
    if args.instructions and Path(args.instructions).is_dir():
        problems.append(f"--instructions {args.instructions}: a folder, not an instruction file")
    elif args.instructions and not Path(args.instructions).is_file():
        problems.append(f"--instructions {args.instructions}: no such file")
    for key, path in (("model.mllm.official_checkpoint", cfg.model.mllm.official_checkpoint),
                      ("model.decoder.official_checkpoint", cfg.model.decoder.official_checkpoint)):
        if path and not Path(path).exists():
            problems.append(f"{key}={path}: no such file or folder")
    out_problem = out_dir_problem(args.out)
    if out_problem:
        problems.append(f"--out {out_problem}; choose another folder")
    elif not args.overwrite and (earlier := unfinished_game(args.out)) is not None:
        problems += resume_problems(args, earlier)
    elif (Path(args.out) / GAME_FILE).exists() and not args.overwrite:
        problems.append(f"--out {args.out} already holds a game ({GAME_FILE}); choose another folder or --overwrite")
    problems += device_problems(args.device, f"--device {args.device}",
                                "--device cpu (or leave --device out: CUDA when available, else the CPU)")
    return problems
