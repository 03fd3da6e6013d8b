"""Show the token layout of a game file: ``animegamer inspect GAME.json [--prompt] [key=value ...]``.

GAME.json is the ``game.json`` that ``animegamer play`` writes (a turn's states: those its MLLM generated),
or ``{"turns": [{"instruction": ..., "states": {"ML": .., "SC": .., "ET": .., "ST": ..}}, ...]}`` as a
session-shard ``json`` record holds them. The last turn is the target; the turns before it within the game's
window are its history, as the game's MLLM read them. Prints JSON: the tokens, ids, masks and labels of the
training sequence (or, with ``--prompt``, of the inference prompt ending in ``<ML>``), plus a compact one-line
rendering, and where the model and the window came from. The layout is the game's: the model preset and the
window that ``game.json`` records (``model``, ``window_turns``) give the tokenizer, the N frame tokens per turn
and the history; ``key=value`` overrides of the evaluate root's ``model`` (``model=small``,
``model.mllm.tokenizer=DIR``) and the options win. A game file that records neither is read at paper sizes
with every earlier turn as history. A game of no turns (an interactive game ended before its first) is shown
with empty lists.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

from omegaconf import OmegaConf

from animegamer.config.compose import command_body, compose_config, group_options, override_key, top_key
from animegamer.contracts.files import GAME_MODEL_KEY as GAME_MODEL
from animegamer.contracts.files import GAME_WINDOW_KEY as GAME_WINDOW
from animegamer.errors import InvalidInputError, UserError, exit_on_user_error
from animegamer.utils.text import doc_summary

ROOT = "evaluate"  # the root config whose model the layout is read from
MODEL = "model"  # the one node of it the layout reads
FALLBACK_MODEL = "paper"  # for a game file that names no model: the paper's layout (the byte tokenizer of a random build)
# Where the model and the window were read from, as the output says.
FROM_OPTIONS, FROM_GAME, FROM_DEFAULT = "command line", "game file", "default"
# The body's parts that load torch: imported once the overrides passed.
describe = command_body("animegamer.mllm.inspect", "describe")
game_turns = command_body("animegamer.mllm.inspect", "game_turns")
open_tokenizer = command_body("animegamer.mllm.inspect", "open_tokenizer")
configured_tokenizer = command_body("animegamer.mllm.inspect", "configured_tokenizer")
query_token_range = command_body("animegamer.mllm.inspect", "query_token_range")
representation_tokens = command_body("animegamer.models.encoder", "representation_tokens")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="animegamer inspect", description=doc_summary(__doc__))
    parser.add_argument("game", type=Path,
                        help="game JSON file with a 'turns' list: the game.json animegamer play writes, or turns "
                             "with 'instruction' and 'states'")
    parser.add_argument("--tokenizer", default=None,
                        help="local tokenizer folder (default: the model's, as the game read it; '' = the byte "
                             "tokenizer)")
    parser.add_argument("--query-tokens", type=int, default=None,
                        help="N, frame tokens per turn (default: the model's representation tokens)")
    parser.add_argument("--window-turns", type=int, default=None,
                        help="the MLLM's window, the target turn included: the target reads the window_turns - 1 "
                             "turns before it (default: game.json's window_turns, else every earlier turn)")
    parser.add_argument("--prompt", action="store_true", help="show the inference prompt (ends in <ML>)")
    parser.add_argument("--indent", type=int, default=None, help="JSON indent (default: one line)")
    # A default makes the overrides optional: argparse reports a '*' positional without one as required.
    parser.add_argument("overrides", nargs="*", default=[], metavar="key=value",
                        help="overrides of the model (model=tiny ...)")
    return parser


def read_game(path: Path) -> dict:
    """The game file's content; a missing, unreadable or malformed file is refused naming it."""
    try:
        game = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise UserError(f"{path}: not a readable JSON game file ({error})") from error
    if not isinstance(game, dict) or not isinstance(game.get("turns"), list):
        raise UserError(f"{path}: a game file holds a 'turns' list")
    return game


def model_preset(game: dict, path: Path, overrides: Sequence[str]) -> tuple[list[str], str]:
    """The preset override to put before the user's and where it comes from: none where the user names one,
    the game's recorded one, else the paper's."""
    if any(override_key(o).lstrip("/") == MODEL for o in overrides):
        return [], FROM_OPTIONS
    if game.get(GAME_MODEL) is None:
        return [f"{MODEL}={FALLBACK_MODEL}"], FROM_DEFAULT
    presets = group_options(MODEL, ROOT)
    name = game[GAME_MODEL]
    if name not in presets:
        raise InvalidInputError(f"{path}: its {GAME_MODEL} {name!r} is no model preset of animegamer inspect "
                                f"({', '.join(presets)}); give the game's model with {MODEL}=NAME")
    return [f"{MODEL}={name}"], FROM_GAME


def window_turns(game: dict, path: Path, given: Optional[int]) -> tuple[Optional[int], str]:
    """The MLLM's window (None: every earlier turn) and where it comes from."""
    if given is not None:
        return given, FROM_OPTIONS
    value: Any = game.get(GAME_WINDOW)
    if value is None:
        return None, FROM_DEFAULT
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidInputError(f"{path}: its {GAME_WINDOW} must be an integer >= 1 (the new turn included), "
                                f"got {value!r}")
    return value, FROM_GAME


def tokenizer_of(args: argparse.Namespace, model, game: dict):
    """The tokenizer the layout is shown with, and its folder ('' = the byte tokenizer); a folder it cannot
    be loaded from is refused naming the option or key that gave it."""
    folder, named = (args.tokenizer, "--tokenizer") if args.tokenizer is not None else \
        configured_tokenizer(model.mllm, game)
    try:
        return open_tokenizer(folder), folder
    except InvalidInputError as error:
        where = f"--tokenizer {folder}" if named == "--tokenizer" else \
            f"{named}={folder}" if named.startswith(f"{MODEL}.") else f"{folder} ({named})"
        raise InvalidInputError(f"{where}: {error}") from None


@exit_on_user_error
def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_intermixed_args(sys.argv[1:] if argv is None else argv)
    unread = [o for o in args.overrides if top_key(o) != MODEL]
    if unread:
        raise UserError(f"{' '.join(unread)}: animegamer inspect reads the model's keys only ({MODEL}=NAME, {MODEL}.*)")
    if args.window_turns is not None and args.window_turns < 1:
        raise UserError(f"--window-turns {args.window_turns}: must be >= 1, the target turn included (1: no "
                        "history)")
    low, high = query_token_range()
    if args.query_tokens is not None and not low <= args.query_tokens <= high:
        raise UserError(f"--query-tokens {args.query_tokens}: must be in [{low}, {high}] (one <frame_i> token of "
                        "the layout per query)")
    game = read_game(args.game)
    preset, model_from = model_preset(game, args.game, args.overrides)
    window, window_from = window_turns(game, args.game, args.window_turns)
    model = OmegaConf.to_object(compose_config(ROOT, [*preset, *args.overrides]).model)
    tokens = representation_tokens(model.encoder) if args.query_tokens is None else args.query_tokens
    if not low <= tokens <= high:
        raise UserError(f"model.encoder of {MODEL} {model.name!r} gives {tokens} representation tokens; the layout "
                        f"holds [{low}, {high}] (set --query-tokens N or the model.encoder keys)")
    try:  # a turn without its instruction or states, or with a value out of range
        turns = game_turns(game)
    except InvalidInputError as error:
        raise InvalidInputError(f"{args.game}: {error}") from None
    tokenizer, folder = tokenizer_of(args, model, game)
    try:
        layout = describe(turns, tokenizer, folder, tokens, args.prompt, window)
    except InvalidInputError as error:  # an instruction the layout cannot hold
        raise InvalidInputError(f"{args.game}: {error}") from None
    described = {"model": model.name, "model_from": model_from, "window_turns": window,
                 "window_turns_from": window_from, **layout}
    sys.stdout.write(json.dumps(described, ensure_ascii=False, indent=args.indent) + "\n")
    return 0


if __name__ == "__main__":  # python -m, as the animegamer command makes its verb look to a process it restarts
    sys.exit(main())
