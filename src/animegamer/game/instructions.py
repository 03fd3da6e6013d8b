"""A game's instructions: read from a file (or typed on stdin), and checked against the MLLM's prompt
before any model is built, so that a line the game could not play stops nothing halfway."""
from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

from animegamer.config.schema import RunConfig
from animegamer.contracts.states import MOTION_LEVEL, STATE_KEYS
from animegamer.data.words import training_word_tokenizer
from animegamer.errors import UserError
from animegamer.mllm.predict import STATE_TOKENS, window
from animegamer.mllm.sequence import Turn, build_prompt
from animegamer.models.encoder import representation_tokens
from animegamer.models.game_mllm import game_tokenizer

log = logging.getLogger(__name__)

# A text editor's byte-order mark is not part of the first instruction.
ENCODING = "utf-8-sig"
COMMENT = "#"
# The longest an instruction is shown in a refusal.
SHOWN_CHARS = 60


def read_instructions(path: str | Path) -> list[str]:
    """One instruction per line; blank lines and lines starting with ``#`` are skipped."""
    path = Path(path)
    if path.is_dir():
        raise UserError(f"{path}: a folder, not an instruction file")
    try:
        lines = path.read_text(encoding=ENCODING).splitlines()
    except UnicodeDecodeError as error:
        raise UserError(f"{path}: not UTF-8 text (byte {error.start}: {error.reason}); save it as UTF-8") from None
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith(COMMENT)]


def stdin_instructions(stream=None, prompt: bool = True) -> Iterable[str]:
    """Instructions typed one per line; an empty line or EOF ends the game."""
    stream = stream or sys.stdin
    while True:
        if prompt:
            print("instruction (empty line ends)> ", end="", file=sys.stderr, flush=True)
        line = stream.readline()
        if not line or not line.strip():
            return
        yield line.strip()


def _shown(text: str) -> str:
    return repr(text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + "...")


def script_checker(cfg: RunConfig, mllm_export: str) -> Callable[[Sequence[str], int, str], list[str]]:
    """:func:`script_problems` over the game's tokenizer, loaded once: a function of the instructions, the
    window and the source's name, for a game that checks each typed line in its turn."""
    tokenizer, ids = game_tokenizer(cfg, [mllm_export] if mllm_export else [], words=training_word_tokenizer)
    queries = representation_tokens(cfg.model.encoder)
    limit = cfg.model.mllm.sliding_window
    neutral = {key: 0 for key in STATE_KEYS} | {MOTION_LEVEL: 1}

    def problems_of(instructions: Sequence[str], window_turns: int, source: str) -> list[str]:
        problems, played = [], []
        for index, instruction in enumerate(instructions):
            try:
                prompt = build_prompt(ids, tokenizer, window(played, window_turns), instruction, queries)
            except ValueError as error:
                said = str(error).replace(f"instruction {instruction!r} ", "it ").replace(repr(instruction), "it")
                problems.append(f"{source}: instruction {index + 1} {_shown(instruction)}: {said}")
                played.append(Turn("", neutral))
                continue
            length = len(prompt.input_ids) + STATE_TOKENS
            if length > limit:
                history = min(index, window_turns - 1)
                problems.append(f"{source}: instruction {index + 1} {_shown(instruction)}: its turn needs {length} "
                                f"tokens ({history} earlier turns in the window, then this one), above the MLLM's "
                                f"sliding window of {limit} (model.mllm.sliding_window): shorten it"
                                + (", or play with a smaller --window-turns" if history else ""))
            played.append(Turn(instruction, neutral))
        return problems

    return problems_of


def script_problems(cfg: RunConfig, mllm_export: str, instructions: Sequence[str], window_turns: int,
                    source: str) -> list[str]:
    """What would stop the game at a turn of ``instructions`` (from ``source``): an instruction holding the
    MLLM's reserved tokens, or a turn whose prompt (its window of earlier turns, then the instruction) and
    state tokens do not fit in the MLLM's sliding window. The prompts are the game's own (their state
    values do not change their length)."""
    return script_checker(cfg, mllm_export)(instructions, window_turns, source)


TYPED = "typed"  # how the problems of a typed instruction name their source


def checked_lines(lines: Iterable[str], problems_of: Callable[[list[str]], list[str]],
                  played: Sequence[str] = ()) -> Iterator[str]:
    """Typed instructions, each checked as the game will play it, after ``played`` and the lines accepted
    before it (``problems_of``: :func:`script_problems` over such a list, whose earlier lines passed): a
    line the game could not play is refused with the reason, and the next one is read instead."""
    accepted = list(played)
    for line in lines:
        problems = problems_of([*accepted, line])
        if problems:
            for problem in problems:
                log.error("%s; type another instruction", problem)
            continue
        accepted.append(line)
        yield line
