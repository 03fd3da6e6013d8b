"""Rank-aware logging: every rank logs to its own records, only rank 0 speaks at INFO by default.

One handler on the root logger writes every line in one format. Lightning installs console handlers of
its own when it is imported (on ``lightning`` always, on ``lightning.pytorch`` / ``lightning.fabric``
when the root logger has none yet), which would print each of its lines a second time, in its own
format. :func:`setup_logging` removes them: at once if Lightning is already imported, otherwise right
after its import (a one-shot import hook, so that commands which never use Lightning do not pay for
importing it).
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import os
import sys

_RANK_ENV_VARS = ("RANK", "SLURM_PROCID", "LOCAL_RANK")
_CHATTY_LIBRARIES = ("matplotlib", "PIL", "pyscenedetect", "urllib3", "httpx")
# Warnings logged when transformers or diffusers import torchao (the fp8 extra) that ask nothing of the user:
# torchao's optional compiled kernels built for another Python (the FP8 path, torch._scaled_mm, does not use
# them), no Triton on a CPU machine, diffusers' torchao checkpoint types, and torch's deprecation of the enum
# registration torchao does at import. (logger, start of the message); every other record passes.
_IMPORT_NOTICES = (
    ("torchao", "Failed to load "),
    ("torchao.kernel.intmm", "Warning: Detected no triton"),
    ("diffusers.quantizers.torchao.torchao_quantizer", "Unable to import `torchao` Tensor objects"),
    ("torch.utils._pytree", "<enum "),
)
# A package whose import adds console handlers, and the loggers it adds them to.
_OWN_HANDLER_PACKAGE = "lightning"
_OWN_HANDLER_LOGGERS = ("lightning", "lightning.pytorch", "lightning.fabric")
_FORMAT = "%(asctime)s %(levelname)s [rank%(rank)s] %(name)s: %(message)s"
_DATE_FORMAT = "%H:%M:%S"


def global_rank() -> int:
    """Rank from the launcher's environment (torchrun, SLURM); 0 when not distributed."""
    for var in _RANK_ENV_VARS:
        value = os.environ.get(var)
        if value is not None and value.isdigit():
            return int(value)
    return 0


def is_global_zero() -> bool:
    """Global rank 0 from the launcher's environment (before the trainer exists): Lightning's own
    children, torchrun and SLURM set these variables; a plain start is rank 0."""
    return global_rank() == 0 and os.environ.get("NODE_RANK", "0") in ("", "0")


class DropPrefix(logging.Filter):
    """Drops the records whose message starts with ``start``. Build one per prefix and keep it: adding
    the same filter object to a logger twice is a no-op, so setting up again adds nothing."""

    def __init__(self, start: str) -> None:
        super().__init__()
        self.start = start

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.start)


# One filter object per notice, built once (see DropPrefix).
_IMPORT_NOTICE_FILTERS = tuple((name, DropPrefix(start)) for name, start in _IMPORT_NOTICES)


class _RankFilter(logging.Filter):
    def __init__(self, rank: int) -> None:
        super().__init__()
        self.rank = rank

    def filter(self, record: logging.LogRecord) -> bool:
        record.rank = self.rank
        return True


def _route_to_root() -> None:
    """Lightning's loggers keep no handler of their own: their records reach the root handler, at its level."""
    for name in _OWN_HANDLER_LOGGERS:
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True
        logger.setLevel(logging.NOTSET)


class _RouteAfterImport(importlib.abc.MetaPathFinder):
    """Finds Lightning like the default path finder does, and runs :func:`_route_to_root` once its
    ``__init__`` (which adds the handlers) has run; then takes itself out of ``sys.meta_path``."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != _OWN_HANDLER_PACKAGE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            load = spec.loader.exec_module

            def exec_module(module) -> None:
                load(module)
                _route_to_root()

            spec.loader.exec_module = exec_module
        return spec


def _route_lightning() -> None:
    if _OWN_HANDLER_PACKAGE in sys.modules:
        _route_to_root()
    elif not any(isinstance(finder, _RouteAfterImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _RouteAfterImport())


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
    _route_lightning()
    for chatty in _CHATTY_LIBRARIES:
        logging.getLogger(chatty).setLevel(max(numeric, logging.WARNING))
    for name, notice in _IMPORT_NOTICE_FILTERS:
        logging.getLogger(name).addFilter(notice)
