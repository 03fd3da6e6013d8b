"""``animegamer <verb> [key=value ...]``: the project's one command line.

The verbs are the entry points of the group ``animegamer.commands`` (setup.cfg), so a verb that lives
outside the library (``pipeline``, in data_pipeline) is found without the library importing it. Each
verb is a console-script function that reads its arguments from ``sys.argv``; only the chosen verb's
module is imported.
"""
from __future__ import annotations

import argparse
import ast
import difflib
import importlib.util
import re
import sys
from importlib.metadata import EntryPoint, entry_points
from typing import Optional, Sequence

from animegamer.errors import USER_ERROR_EXIT_CODE, UserError, exit_on_user_error
from animegamer.utils.text import doc_summary

PROG = "animegamer"
COMMANDS_GROUP = "animegamer.commands"
INLINE_CODE = re.compile(r"``[^`]*``:?\s*")
EMPTY_PARENTHESES = re.compile(r"\(\W*\)")  # what is left of "(``a``, ``b``)"


def commands() -> dict[str, EntryPoint]:
    """Every installed verb, by name."""
    return {ep.name: ep for ep in entry_points(group=COMMANDS_GROUP)}


def summary(entry_point: EntryPoint) -> str:
    """The first paragraph of the verb's module docstring without its example command lines, read from its
    source without importing it (the verbs import the networks)."""
    spec = importlib.util.find_spec(entry_point.module)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return ""
    with open(spec.origin, encoding="utf-8") as source:
        doc = ast.get_docstring(ast.parse(source.read())) or ""
    first = " ".join(doc.strip().split("\n\n")[0].split())  # the first paragraph: a first line may end mid-sentence
    words = EMPTY_PARENTHESES.sub("", INLINE_CODE.sub("", first))  # the words, without the example command lines
    return re.sub(r" ([:,;])", r"\1", " ".join(words.split())).strip(" :.,")


def build_parser(verbs: dict[str, EntryPoint]) -> argparse.ArgumentParser:
    listing = "\n".join(f"  {name:<11} {summary(ep)}" for name, ep in sorted(verbs.items()))
    parser = argparse.ArgumentParser(
        prog=PROG, formatter_class=argparse.RawDescriptionHelpFormatter,
        description=doc_summary(__doc__),  # the docstring's literal marks are not for a terminal
        epilog=f"verbs:\n{listing}\n\nEvery verb takes key=value overrides; {PROG} VERB --help shows its own.")
    parser.add_argument("verb", metavar="VERB", help="one of the verbs below")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the verb's options and key=value overrides")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run ``animegamer VERB ARGS``: the verb's exit code (a user error: its message and exit code 2)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    verbs = commands()
    parser = build_parser(verbs)
    if not argv or argv[0] in ("-h", "--help"):
        parser.print_help()
        return 0 if argv else USER_ERROR_EXIT_CODE  # no verb: a usage error
    verb, rest = argv[0], argv[1:]
    if verb not in verbs:
        exit_on_user_error(_unknown)(verb, verbs)  # its message and exit code 2
    command = verbs[verb].load()
    sys.argv = [f"{PROG} {verb}", *rest]  # every verb reads its arguments as its console script does
    relaunch_as(verbs[verb].module)
    result = exit_on_user_error(command)()
    return result if isinstance(result, int) else 0


def relaunch_as(module: str) -> None:
    """Make this process one that ``python -m module`` started: whatever starts it again with ``sys.argv[1:]``
    (Lightning's launcher of the other DDP ranks, multiprocessing's spawn) then runs the verb's module,
    not ``sys.argv[0]``, which names the verb (``animegamer train``) and is no file."""
    sys.modules["__main__"].__spec__ = importlib.util.find_spec(module)


def _unknown(verb: str, verbs: dict[str, EntryPoint]) -> None:
    match = difflib.get_close_matches(verb, list(verbs), n=1)
    hint = f"did you mean '{match[0]}'? " if match else ""
    raise UserError(f"{PROG}: no verb '{verb}'; {hint}verbs: {', '.join(sorted(verbs))}")
