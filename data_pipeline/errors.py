"""Errors that name the offending input, so a report can list them and the run can go on."""
from __future__ import annotations


class BadInput(Exception):
    """An input file that cannot be used; ``reason`` is a short machine-readable code."""

    def __init__(self, path: str, reason: str, detail: str = "") -> None:
        self.path = str(path)
        self.reason = reason
        self.detail = detail
        super().__init__(f"{path}: {reason}" + (f" ({detail})" if detail else ""))

    def to_json(self) -> dict:
        return {"path": self.path, "reason": self.reason, "detail": self.detail}
