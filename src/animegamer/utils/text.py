"""Wording shared by the reports and pages: counts that agree in number."""
from __future__ import annotations


def count_of(n: int, noun: str) -> str:
    """``1 game``, ``2 games``, ``0 turns``: a count and its noun, plural but for one."""
    return f"{n} {noun}" + ("" if n == 1 else "s")
