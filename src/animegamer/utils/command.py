"""The command line as manifests, reports and lock files record it.

A URL given on the command line may carry a password or a key in its query (``pipeline.caption.url``,
``evaluation.judge.url``, a storage address): what is recorded is the command shell-quoted (so it can
be run again) with every such secret masked by :func:`animegamer.utils.http.redact`.
"""
from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Optional, Sequence

from animegamer.utils.http import redact


def recorded_command(argv: Optional[Sequence[str]] = None) -> str:
    """``argv`` (default: this process's ``sys.argv``) shell-quoted, with the user, password and query
    values of every URL in it masked."""
    return redact(shlex.join(sys.argv if argv is None else argv))


def program_name(module: str) -> str:
    """The command as the user typed it, for a usage line and argparse's errors: ``animegamer VERB`` (the
    ``sys.argv[0]`` the ``animegamer`` dispatcher sets) or an ``animegamer-*`` script, else ``python -m
    module``."""
    name = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else ""
    return name if name.startswith("animegamer") else f"python -m {module}"
