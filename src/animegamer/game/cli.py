"""The game's command line (``python -m animegamer.game``, ``animegamer play``): instructions from a file
or typed on stdin, the exports loaded, the game played into its folder."""
from __future__ import annotations

import argparse
import logging
import sys
from itertools import chain, islice
from pathlib import Path
from typing import Optional, Sequence

import torch
from omegaconf import OmegaConf

import animegamer.game
from animegamer.checkpoints.trained_data import preset_overrides
from animegamer.config.compose import compose_config
from animegamer.config.schema import RunConfig
from animegamer.config.validate import ConfigError
from animegamer.contracts.files import GAME_PAGE_FILE
from animegamer.errors import UserError, exit_on_user_error
from animegamer.game.instructions import (TYPED, checked_lines, read_instructions, script_checker, script_problems,
                                          stdin_instructions)
from animegamer.game.models import load_game_models, read_level_flow
from animegamer.game.preflight import input_problems
from animegamer.game.writer import unfinished_game
from animegamer.game.scheduler import play_game
from animegamer.mllm.sequence import MALFORMED
from animegamer.utils.command import program_name
from animegamer.utils.folder_lock import folder_lock
from animegamer.utils.logging import setup_logging

log = logging.getLogger("animegamer.game")  # the same name under ``python -m animegamer.game``


DTYPES = {"auto": None, "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def build_parser(prog: Optional[str] = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog or program_name("animegamer.game"),
                                     description=animegamer.game.__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mllm", default="",
                        help="phase (b) export folder (required unless model.mllm.official_checkpoint is set)")
    parser.add_argument("--renderer", action="append", default=[],
                        help="phase (c) export folder (or phase (a)); repeat to load several in order (required "
                             "unless model.decoder.official_checkpoint is set)")
    parser.add_argument("--clips-manifest", required=True,
                        help="pipeline manifest.json (or its folder) with motion_bins.level_flow")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--instructions", help="UTF-8 text file, one instruction per line (# starts a comment line)")
    source.add_argument("--interactive", action="store_true", help="read instructions from stdin")
    parser.add_argument("--out", required=True,
                        help="output folder (clips, game.json, index.html); created, never a file")
    parser.add_argument("--seed", type=int, default=None, help="sampler seed (default: the config's seed)")
    parser.add_argument("--max-turns", type=int, default=0,
                        help="stop after this many turns (default 0: every instruction of the file, whose blank lines "
                             "and lines starting with # are skipped; with --interactive, until an empty line)")
    parser.add_argument("--window-turns", type=int, default=None,
                        help="turns the MLLM sees, the new one included, >= 1: the last N-1 played turns are its "
                             "history (default K, the number of window lengths phase (b) trained on: "
                             "data.window_weights)")
    parser.add_argument("--sampling-steps", type=int, default=None,
                        help="DPM++ steps, >= 1 (default: model.diffusion.sampling_steps)")
    parser.add_argument("--device", default=None,
                        help="cuda, cuda:N or cpu (default: cuda when torch sees a GPU, else cpu)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="auto",
                        help="model dtype (auto: bfloat16 on CUDA, float32 on CPU)")
    parser.add_argument("--constrained-states", action="store_true",
                        help="decode the states within the layout (model.mllm.constrained_states=true): never "
                             "malformed, for briefly trained exports")
    parser.add_argument("--overwrite", action="store_true", help="replace a game already in --out")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of the train config (model=..., ...; "
                                                      "default model: the preset the exports were trained with)")
    return parser


@exit_on_user_error
def main(argv: Optional[Sequence[str]] = None) -> int:
    """The command line; returns 0, or 1 when a malformed generation stopped the game. A wrong input
    (path, override, option value, device, an --out that holds a game or is a file) exits with code 2 and
    its message before any model is built, no traceback."""
    args = build_parser().parse_intermixed_args(argv)
    overrides = preset_overrides(list(args.overrides), [args.mllm, *args.renderer])
    if args.constrained_states:
        overrides.append("model.mllm.constrained_states=true")
    cfg: RunConfig = OmegaConf.to_object(compose_config("train", overrides))
    setup_logging(cfg.log_level)
    problems = input_problems(args, cfg)
    if problems:
        raise ConfigError(problems)
    level_flow = read_level_flow(args.clips_manifest)
    instructions = read_instructions(args.instructions) if args.instructions else None
    if instructions is not None and not instructions:
        raise UserError(f"{args.instructions}: no instructions")
    if args.max_turns and instructions is not None and len(instructions) > args.max_turns:
        log.info("--max-turns %d: playing the first %d of %d instructions", args.max_turns, args.max_turns,
                 len(instructions))
    window_turns = args.window_turns or len(cfg.data.window_weights)
    if instructions is not None:
        problems = script_problems(cfg, args.mllm, instructions[:args.max_turns or None], window_turns,
                                   args.instructions)
        if problems:
            raise ConfigError(problems)
    seed = cfg.seed if args.seed is None else args.seed
    made_out = not Path(args.out).exists()  # the lock makes the folder: removed again if no game is written
    # One game command per folder at a time (a second one waits, then is refused naming the first).
    with folder_lock(args.out, cfg.lock_wait_seconds):
        models = load_game_models(cfg, args.mllm, args.renderer, level_flow, device=args.device,
                                  dtype=DTYPES[args.dtype])
        # An unfinished game in --out (stopped by Ctrl-C or a crash) goes on after the turns it played.
        earlier = None if args.overwrite else unfinished_game(args.out)
        played = len(earlier["turns"]) if earlier else 0
        if instructions is not None:
            script = iter(instructions[played:])
        else:  # each typed line checked as the file's are, before it is played
            checker = script_checker(cfg, args.mllm)
            script = checked_lines(stdin_instructions(), lambda lines: checker(lines, window_turns, TYPED),
                                   [turn["instruction"] for turn in (earlier or {}).get("turns", [])])
        first = next(script, None)
        record = None  # an interactive game ended before its first instruction: none
        if first is not None or earlier is not None:
            try:
                # Game's 0 steps: the config's; the pre-flight refused a given value below 1.
                sampling_steps = 0 if args.sampling_steps is None else args.sampling_steps
                left = max(args.max_turns - played, 0) if args.max_turns else None
                record = play_game(models, islice(chain([first] if first is not None else [], script), left),
                                   args.out, seed, window_turns=args.window_turns, sampling_steps=sampling_steps,
                                   overwrite=args.overwrite, resume=not args.overwrite,
                                   extra={"turn_limit": args.max_turns or None})
            except ValueError as error:
                way_on = "" if args.constrained_states or MALFORMED not in str(error) else (
                    "; a briefly trained MLLM plays through with --constrained-states (the states decoded within "
                    "the layout), or train phase (b) longer")
                log.error("game stopped: %s%s", error, way_on)
                return 1
    if record is None:
        if made_out:
            try:
                Path(args.out).rmdir()  # it held only the lock, released now
            except OSError:  # something else came into it meanwhile: it stays
                pass
        log.info("no instruction given: no game played, nothing written to %s", args.out)
        return 0
    log.info("%d turns, final states %s: %s", len(record["turns"]), record["states"], Path(args.out) / GAME_PAGE_FILE)
    return 0


if __name__ == "__main__":  # python -m, as the animegamer command makes its verb look to a process it restarts
    sys.exit(main())
