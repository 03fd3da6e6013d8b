"""Errors a user can fix (a wrong setting, a wrong path, a folder already used) and how entry points show them.

Raise :class:`UserError` (or a subclass) for a problem the message alone explains (the configuration
check's ``ConfigError`` is one). An entry point wrapped in :func:`exit_on_user_error` prints
such an error as one clean message (no traceback) and exits with :data:`USER_ERROR_EXIT_CODE`; any
other exception keeps its traceback, because it is a bug to report.
"""
from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys
import threading
from typing import Callable, Iterator, TypeVar

USER_ERROR_EXIT_CODE = 2  # what argparse uses for a wrong command line
INTERRUPTED_EXIT_CODE = 130  # 128 + SIGINT: what a shell reports for a command Ctrl-C stopped
# Every result is written whole (atomically) and every long step resumes, so a stop at any moment loses nothing.
INTERRUPTED_MESSAGE = "interrupted: what is written so far is kept; run the same command again to resume"
# Set by torchrun and Lightning for each process of a node. Every process of a distributed run checks the same
# config and refuses it alike, so the node's first one says why and the others only exit with the code.
LOCAL_RANK_ENV = "LOCAL_RANK"

T = TypeVar("T")


class UserError(Exception):
    """A problem the user fixes from its message alone (entry points print it without a traceback)."""


class OutputExistsError(UserError, FileExistsError):
    """The output folder already holds a result that the command would overwrite."""


class MissingInputError(UserError, FileNotFoundError):
    """A file or folder the command reads is missing or is not what it should be."""


class InvalidInputError(UserError, ValueError):
    """A file the command reads exists but holds something it cannot use."""


class UnsafeCheckpointError(InvalidInputError):
    """A weights file refused before anything in it ran: it holds pickled objects beyond torch's
    weights-only allow-list (loading it fully could run code from the file), or it is not in the safe
    format (safetensors) that its role promises."""


def is_user_error(error: BaseException) -> bool:
    """True for :class:`UserError` (the configuration check's ``ConfigError`` included) and Hydra's refusal of an
    override (unknown group or key, wrong type, bad syntax) in a config composed by the command, or of a config
    file that is not YAML (a user's experiment file: the parser's message names the file, line and column)."""
    from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException
    from yaml import YAMLError

    return isinstance(error, (UserError, ConfigCompositionException, MissingConfigException, OverrideParseException,
                              YAMLError))


def _say(line: str) -> None:
    """``line`` on stderr, once per node under a distributed launch."""
    if os.environ.get(LOCAL_RANK_ENV, "0") in ("", "0"):
        sys.stderr.write(f"{line}\n")
        sys.stderr.flush()


_ctrl_c = {"pressed": False}


def _on_ctrl_c(signum, frame) -> None:
    _ctrl_c["pressed"] = True
    raise KeyboardInterrupt


def stop_if_interrupted() -> None:
    """Raise ``KeyboardInterrupt`` where a Ctrl-C was pressed but swallowed (Python ignores an exception raised in
    an object's ``__del__``, where the signal may land), so a long command stops at its next step instead of
    running to its end; called between a command's steps."""
    if _ctrl_c["pressed"]:
        raise KeyboardInterrupt


@contextlib.contextmanager
def _ctrl_c_noted() -> Iterator[None]:
    """Python's own Ctrl-C behaviour, with the press noted for :func:`stop_if_interrupted` (only where Python's
    handler is in place: a command started with Ctrl-C ignored keeps ignoring it)."""
    noted = (threading.current_thread() is threading.main_thread()
             and signal.getsignal(signal.SIGINT) is signal.default_int_handler)
    if noted:
        signal.signal(signal.SIGINT, _on_ctrl_c)
    try:
        yield
    finally:
        if noted:
            signal.signal(signal.SIGINT, signal.default_int_handler)
            _ctrl_c["pressed"] = False


def exit_on_user_error(func: Callable[..., T]) -> Callable[..., T]:
    """Run an entry point; a user error becomes ``error: <message>`` on stderr (once per node under a distributed
    launch) and exit code 2; Ctrl-C that reaches it (outside a training step, which saves first) becomes
    :data:`INTERRUPTED_MESSAGE` and exit code 130, without a traceback."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            with _ctrl_c_noted():
                return func(*args, **kwargs)
        except KeyboardInterrupt:
            _say(INTERRUPTED_MESSAGE)
            raise SystemExit(INTERRUPTED_EXIT_CODE) from None
        except Exception as error:  # noqa: BLE001 - only user errors are caught, the rest re-raised as is
            if not is_user_error(error):
                raise
            _say(f"error: {error}")
            raise SystemExit(USER_ERROR_EXIT_CODE) from None

    return wrapper
