"""Ctrl-C as a user presses it: any command stops with one line and the shell's code for an interrupted
command, also where Python swallowed the KeyboardInterrupt (an object's ``__del__`` it landed in): the
command then stops at its next step instead of running to its end."""
from __future__ import annotations

import os
import signal

import pytest

from animegamer.errors import INTERRUPTED_EXIT_CODE, INTERRUPTED_MESSAGE, exit_on_user_error, stop_if_interrupted


class _Swallows:
    """Ctrl-C arriving while Python runs this object's ``__del__``: the exception is printed and ignored."""

    def __del__(self):
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):  # the handler runs between bytecodes, here
            pass


@pytest.fixture
def python_ctrl_c():
    """Python's own Ctrl-C handler, as a command started from a shell has it."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the swallowed Ctrl-C, as meant
def test_a_swallowed_ctrl_c_stops_the_command_at_its_next_step(python_ctrl_c, capsys):
    steps = []

    def command():
        for step in ("cut", "precompute", "sessions"):
            stop_if_interrupted()
            steps.append(step)
            if step == "cut":
                _Swallows()  # dropped at once: its __del__ swallows the Ctrl-C
        return "finished"

    with pytest.raises(SystemExit) as stopped:
        exit_on_user_error(command)()
    assert stopped.value.code == INTERRUPTED_EXIT_CODE == 130
    assert steps == ["cut"]
    assert capsys.readouterr().err.strip().splitlines()[-1] == INTERRUPTED_MESSAGE
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # Python's handler is back
    stop_if_interrupted()  # and the press is forgotten with the command


def test_without_ctrl_c_a_command_runs_through_and_an_ignored_ctrl_c_stays_ignored(python_ctrl_c):
    assert exit_on_user_error(lambda: (stop_if_interrupted(), "finished")[1])() == "finished"
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a script's background job
    seen = exit_on_user_error(lambda: signal.getsignal(signal.SIGINT))()
    assert seen is signal.SIG_IGN
