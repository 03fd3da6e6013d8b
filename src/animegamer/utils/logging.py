"""Rank-aware logging: every rank logs to its own records, only rank 0 speaks at INFO by default."""
from __future__ import annotations

import logging
import os

_RANK_ENV_VARS = ("RANK", "SLURM_PROCID", "LOCAL_RANK")
_CHATTY_LIBRARIES = ("matplotlib", "PIL", "pyscenedetect", "urllib3", "httpx")
_FORMAT = "%(asctime)s %(levelname)s [rank%(rank)s] %(name)s: %(message)s"


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


def setup_logging(level: str | int = "INFO") -> None:
    """Configure the root logger once; non-zero ranks only report warnings and errors."""
    rank = global_rank()
    handler = logging.StreamHandler()
    handler.addFilter(_RankFilter(rank))
    handler.setFormatter(logging.Formatter(_FORMAT, datefmt="%H:%M:%S"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    numeric = logging.getLevelName(level) if isinstance(level, str) else level
    root.setLevel(numeric if rank == 0 else max(numeric, logging.WARNING))
    for chatty in _CHATTY_LIBRARIES:
        logging.getLogger(chatty).setLevel(max(numeric, logging.WARNING))
