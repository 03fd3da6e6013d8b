"""Fault-injection driver for tests/test_faults.py: trains a phase in a child process and kills it.

Run as ``python tests/fault_driver.py``: it imports torch, Lightning and the phases once, then reads
JSON requests on stdin, one a line, and answers one JSON line each on stdout:

* ``{"op": "start", "overrides": [...], "log": path, ...faults}`` forks a child that runs
  ``animegamer.phases.run.run`` on ``compose_config("train", overrides)`` exactly as ``train.py``
  does (stdout and stderr to ``log``); answers ``{"pid": pid}``.
* ``{"op": "wait", "pid": pid}`` answers ``{"rc": code}`` (negative: killed by that signal).

Forking from a process that has already imported everything saves the ~5 s import of every run,
which keeps the suite fast enough for CI; the child is an ordinary process that a SIGKILL ends with
no chance to clean up. Faults (none of them touches the library, only this child's copy of it):

* ``kill: {"step": K, "hook": h}``: SIGKILL itself in callback hook ``h`` (``on_train_batch_start``,
  ``on_before_backward``, ``on_before_optimizer_step`` or ``on_train_batch_end``) the first time it
  runs with ``trainer.global_step == K``.
* ``kill_in_save: n``: on the n-th checkpoint save, ``torch.save`` writes half of the ``.partial``
  file, then SIGKILLs itself.
* ``pause: {"step": K, "hook": h, "micro": m}``: in hook ``h`` at ``global_step == K`` and micro-batch
  ``batch_idx % accumulate == m``, write ``<log>.ready`` and wait (at most 60 s) until the signal the
  test sends from outside (``"signal"``, default SIGTERM) has arrived (and gone to the trainer's
  handler); then carry on.
"""
from __future__ import annotations

import io
import json
import os
import signal
import sys
import time
import traceback

HOOKS = ("on_train_batch_start", "on_before_backward", "on_before_optimizer_step", "on_train_batch_end")


def _fault_callback(kill: dict | None, pause: dict | None, ready: str):
    import lightning as L

    class Fault(L.Callback):
        def __init__(self) -> None:
            self.batch_idx = 0
            self.paused = False

        def _at(self, hook: str, trainer) -> None:
            step = trainer.global_step
            if kill and hook == kill["hook"] and step == kill["step"]:
                os.kill(os.getpid(), signal.SIGKILL)
            if pause and not self.paused and hook == pause["hook"] and step == pause["step"] \
                    and self.batch_idx % trainer.accumulate_grad_batches == pause.get("micro", 0):
                self.paused = True
                signum = getattr(signal, pause.get("signal", "SIGTERM"))
                handler, received = signal.getsignal(signum), []

                def note(signum, frame):  # then whatever handler the trainer has installed
                    received.append(signum)
                    if callable(handler):
                        handler(signum, frame)

                signal.signal(signum, note)
                open(ready, "w").close()
                deadline = time.monotonic() + 60
                while not received and time.monotonic() < deadline:
                    time.sleep(0.005)
                signal.signal(signum, handler)

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            self.batch_idx = batch_idx
            self._at("on_train_batch_start", trainer)

        def on_before_backward(self, trainer, pl_module, loss) -> None:
            self._at("on_before_backward", trainer)

        def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
            self._at("on_before_optimizer_step", trainer)

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            self._at("on_train_batch_end", trainer)

    return Fault()


def _install_faults(request: dict) -> None:
    import torch

    from animegamer.phases import run as runner

    kill, pause = request.get("kill"), request.get("pause")
    if kill or pause:
        make_trainer = runner.make_trainer
        fault = _fault_callback(kill, pause, request["log"] + ".ready")
        runner.make_trainer = lambda cfg, callbacks: make_trainer(cfg, [*callbacks, fault])
    if request.get("kill_in_save"):
        save, saves = torch.save, [0]

        def torn_save(obj, f, *args, **kwargs):
            if not str(getattr(f, "name", "")).endswith(".partial"):
                return save(obj, f, *args, **kwargs)
            saves[0] += 1
            if saves[0] < request["kill_in_save"]:
                return save(obj, f, *args, **kwargs)
            buffer = io.BytesIO()
            save(obj, buffer, *args, **kwargs)
            f.write(buffer.getvalue()[: buffer.tell() // 2])
            f.flush()
            os.fsync(f.fileno())
            os.kill(os.getpid(), signal.SIGKILL)

        torch.save = torn_save


def _child(request: dict) -> None:
    code = 1
    try:
        fd = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        sys.stdin.close()
        # as launched from a terminal, whatever the test runner's own SIGINT disposition (a background job ignores it)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        from animegamer.config.compose import compose_config
        from animegamer.phases.run import run

        _install_faults(request)
        run(compose_config("train", request["overrides"]))
        code = 0
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 1
    except BaseException:  # noqa: BLE001 - the log has the traceback, the test the exit code
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def main() -> None:
    # Everything a run imports, imported once here (nothing runs, so no thread pool exists to fork).
    import lightning  # noqa: F401
    import torch  # noqa: F401

    import animegamer.config.compose  # noqa: F401
    import animegamer.data.phase_a  # noqa: F401
    import animegamer.data.phase_b  # noqa: F401
    import animegamer.data.phase_c  # noqa: F401
    import animegamer.phases.phase_a  # noqa: F401
    import animegamer.phases.phase_b  # noqa: F401
    import animegamer.phases.phase_c  # noqa: F401
    import animegamer.phases.run  # noqa: F401

    answer = lambda value: (sys.stdout.write(json.dumps(value) + "\n"), sys.stdout.flush())
    for line in sys.stdin:
        request = json.loads(line)
        if request["op"] == "start":
            sys.stdout.flush()
            pid = os.fork()
            if pid == 0:
                _child(request)
            answer({"pid": pid})
        elif request["op"] == "wait":
            _, status = os.waitpid(request["pid"], 0)
            answer({"rc": os.waitstatus_to_exitcode(status)})


if __name__ == "__main__":
    main()
