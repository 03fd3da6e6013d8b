"""Rank-aware logging: every rank logs to its own records, only rank 0 speaks at INFO by default.

One handler on the root logger writes every line in one format. Libraries that install their own
console handler (Lightning adds one to ``lightning`` whenever it is imported, and to
``lightning.pytorch`` / ``lightning.fabric`` when the root logger has none yet) would print each of
their lines a second time, in their own format: :func:`setup_logging` imports them and removes those
handlers, so their records reach the root handler only.
"""
from __future__ import annotations

import importlib
import importlib.util
import logging
import os

_RANK_ENV_VARS = ("RANK", "SLURM_PROCID", "LOCAL_RANK")
_CHATTY_LIBRARIES = ("matplotlib", "PIL", "pyscenedetect", "urllib3", "httpx")
# Packages whose import adds console handlers, and the loggers they add them to.
_OWN_HANDLER_PACKAGES = {"lightning": ("lightning", "lightning.pytorch", "lightning.fabric")}
_FORMAT = "%(asctime)s %(levelname)s [rank%(rank)s] %(name)s: %(message)s"
_DATE_FORMAT = "%H:%M:%S"


def global_rank() -> int:
    """Rank from the launcher's environment (torchrun, SLURM); 0 when not distributed."""
    for var in _RANK_ENV_VARS:
        value = os.environ.get(var)
        if value is not None and value.isdigit():
            return int(value)
    return 0


class _RankFilter(logging.Filter):
    def __init__(self, rank: int) -> None:
        super().__init__()
        self.rank = rank

    def filter(self, record: logging.LogRecord) -> bool:
        record.rank = self.rank
        return True


def _route_to_root(package: str, loggers: tuple[str, ...]) -> None:
    """Import ``package`` (when installed) so its import-time handlers exist, then remove them: its
    records propagate to the root handler, at the root's level."""
    if importlib.util.find_spec(package) is None:
        return
    importlib.import_module(package)
    for name in loggers:
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True
        logger.setLevel(logging.NOTSET)


def setup_logging(level: str | int = "INFO") -> None:
    """Configure the root logger (one handler, one format); non-zero ranks only report warnings and errors."""
    rank = global_rank()
    handler = logging.StreamHandler()
    handler.addFilter(_RankFilter(rank))
    handler.setFormatter(logging.Formatter(_FORMAT, datefmt=_DATE_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    numeric = logging.getLevelName(level.upper()) if isinstance(level, str) else level
    root.setLevel(numeric if rank == 0 else max(numeric, logging.WARNING))
    for package, loggers in _OWN_HANDLER_PACKAGES.items():
        _route_to_root(package, loggers)
    for chatty in _CHATTY_LIBRARIES:
        logging.getLogger(chatty).setLevel(max(numeric, logging.WARNING))
