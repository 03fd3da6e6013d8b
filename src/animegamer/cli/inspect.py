"""Show the token layout of a game file: ``animegamer inspect GAME.json [--prompt] [key=value ...]``.

GAME.json is the ``game.json`` that ``animegamer play`` writes (a turn's states: those its MLLM generated),
or ``{"turns": [{"instruction": ..., "states": {"ML": .., "SC": .., "ET": .., "ST": ..}}, ...]}`` as a
session-shard ``json`` record holds them. Every turn but the last is history; the last is the
target. Prints JSON: the tokens, ids, masks and labels of the training sequence (or, with
``--prompt``, of the inference prompt ending in ``<ML>``), plus a compact one-line rendering. The layout
is the model's: ``key=value`` overrides of the evaluate root's ``model`` (``model=tiny``,
``model.mllm.tokenizer=DIR``) give its tokenizer and its N frame tokens per turn; paper sizes by default.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Optional, Sequence

from omegaconf import OmegaConf

from animegamer.config.compose import command_body, compose_config, top_key
from animegamer.errors import InvalidInputError, UserError, exit_on_user_error

ROOT = "evaluate"  # the root config whose model the layout is read from
MODEL = "model"  # the one node of it the layout reads
DEFAULTS = ("model=paper",)  # the paper's layout (the byte tokenizer of a random build, N = 226) unless overridden
# The body's parts that load torch: imported once the overrides passed.
describe = command_body("animegamer.mllm.inspect", "describe")
representation_tokens = command_body("animegamer.models.encoder", "representation_tokens")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="animegamer inspect", description=__doc__.split("\n\n")[0].replace("``", ""))
    parser.add_argument("game", type=Path,
                        help="game JSON file with a 'turns' list: the game.json animegamer play writes, or turns "
                             "with 'instruction' and 'states'")
    parser.add_argument("--tokenizer", default=None,
                        help="local tokenizer folder (default: model.mllm.tokenizer; '' = the byte tokenizer)")
    parser.add_argument("--query-tokens", type=int, default=None,
                        help="N, frame tokens per turn (default: the model's representation tokens, 226 at paper sizes)")
    parser.add_argument("--prompt", action="store_true", help="show the inference prompt (ends in <ML>)")
    parser.add_argument("--indent", type=int, default=None, help="JSON indent (default: one line)")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="overrides of the model (model=tiny ...)")
    return parser


def read_game(path: Path) -> dict:
    """The game file's content; a missing, unreadable or malformed file is refused naming it."""
    try:
        game = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise UserError(f"{path}: not a readable JSON game file ({error})") from error
    if not isinstance(game, dict) or not isinstance(game.get("turns"), list) or not game["turns"]:
        raise UserError(f"{path}: a game file holds a non-empty 'turns' list")
    return game


@exit_on_user_error
def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_intermixed_args(sys.argv[1:] if argv is None else argv)
    unread = [o for o in args.overrides if top_key(o) != MODEL]
    if unread:
        raise UserError(f"{' '.join(unread)}: animegamer inspect reads the model's keys only ({MODEL}=NAME, {MODEL}.*)")
    model = OmegaConf.to_object(compose_config(ROOT, [*DEFAULTS, *args.overrides]).model)
    tokenizer = model.mllm.tokenizer if args.tokenizer is None else args.tokenizer
    tokens = representation_tokens(model.encoder) if args.query_tokens is None else args.query_tokens
    try:
        described = describe(read_game(args.game), tokenizer, tokens, args.prompt)
    except InvalidInputError as error:  # a turn without its instruction or states, or with a value out of range
        raise InvalidInputError(f"{args.game}: {error}") from None
    sys.stdout.write(json.dumps(described, ensure_ascii=False, indent=args.indent) + "\n")
    return 0


if __name__ == "__main__":  # python -m, as the animegamer command makes its verb look to a process it restarts
    sys.exit(main())
