"""Wording shared by the messages, reports and pages: counts that agree in number, lists read as words."""
from __future__ import annotations

from typing import Sequence


def count_of(n: int, noun: str) -> str:
    """``1 game``, ``2 games``, ``0 turns``: a count and its noun, plural but for one."""
    return f"{n} {noun}" + ("" if n == 1 else "s")


def join_words(words: Sequence[str]) -> str:
    """``a``; ``a and b``; ``a, b and c``."""
    words = list(words)
    return " and ".join([", ".join(words[:-1]), words[-1]] if len(words) > 1 else words)
