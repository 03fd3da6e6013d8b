"""Wording shared by the messages, reports and pages: counts that agree in number, lists read as words."""
from __future__ import annotations

import re
from typing import Sequence


def count_of(n: int, noun: str) -> str:
    """``1 game``, ``2 games``, ``0 turns``: a count and its noun, plural but for one."""
    return f"{n} {noun}" + ("" if n == 1 else "s")


def join_words(words: Sequence[str]) -> str:
    """``a``; ``a and b``; ``a, b and c``."""
    words = list(words)
    return " and ".join([", ".join(words[:-1]), words[-1]] if len(words) > 1 else words)


def doc_summary(doc: str | None) -> str:
    """A module docstring's first paragraph on one line, without reST's marks (``literal``, :mod:`name`): a
    command's ``--help`` description, whole where the docstring's first line would end mid-sentence. A
    paragraph that introduces a list (ending in a colon) ends in a full stop instead."""
    first = " ".join((doc or "").strip().split("\n\n")[0].split()).replace("``", "")
    first = re.sub(r":[a-z]+:`~?([^`]+)`", r"\1", first)
    return first[:-1] + "." if first.endswith(":") else first
