"""Fault-injection driver for tests/test_faults.py: trains a phase in a child process and kills it.

Run as ``python tests/fault_driver.py``: it imports torch, Lightning and the phases once, then reads
JSON requests on stdin, one a line, and answers one JSON line each on stdout:

* ``{"op": "start", "overrides": [...], "log": path, ...faults}`` forks a child that runs
  ``animegamer.phases.run.run`` on ``compose_config("train", overrides)`` exactly as ``train.py``
  does (stdout and stderr to ``log``); answers ``{"pid": pid}``.
* ``{"op": "start", "script": path, "args": [...], "log": path, "session": bool}`` forks a child that runs
  the script as ``python path args...`` would (``sys.argv`` set, run as ``__main__``), in a session of its
  own if asked (a process-group kill then reaches what it starts); answers ``{"pid": pid}``. A process
  the script launches itself (Lightning's rank 1 of ``train.py``) is a fresh interpreter, as ever.
* ``{"op": "wait", "pid": pid, "timeout": s}`` answers ``{"rc": code, "timed_out": bool}`` (negative:
  killed by that signal); past the optional timeout the child (its session, if it has one) is SIGKILLed.

:class:`Driver` is the test side (importing this module is cheap: the heavy imports are in ``main``).

Forking from a process that has already imported everything saves the import of every run (seconds),
which keeps the suite fast enough for CI; the child is an ordinary process that a SIGKILL ends with
no chance to clean up. Faults (none of them touches the library, only this child's copy of it):

* ``kill: {"step": K, "hook": h}``: SIGKILL itself in callback hook ``h`` (``on_train_batch_start``,
  ``on_before_backward``, ``on_before_optimizer_step`` or ``on_train_batch_end``) the first time it
  runs with ``trainer.global_step == K``.
* ``kill_in_save: n``: on the n-th checkpoint save, ``torch.save`` writes half of the ``.partial``
  file, then SIGKILLs itself.
* ``pause: {"step": K, "hook": h, "micro": m}``: in hook ``h`` at ``global_step == K`` and micro-batch
  ``batch_idx % accumulate == m``, write ``<log>.ready`` and wait (at most 60 s) until the signal the
  test sends from outside (``"signal"``, default SIGTERM) has arrived ``"times"`` times (default once),
  each gone to the trainer's handler; then carry on.
"""
from __future__ import annotations

import io
import json
import os
import runpy
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

HOOKS = ("on_train_batch_start", "on_before_backward", "on_before_optimizer_step", "on_train_batch_end")
ROOT = Path(__file__).resolve().parents[1]


class Driver:
    """This module in a subprocess: ``start``/``launch`` fork a run, ``wait`` reaps it."""

    def __init__(self) -> None:
        path = filter(None, [str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH")])
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
               "PYTHONPATH": os.pathsep.join(path)}
        self.proc = subprocess.Popen([sys.executable, __file__], cwd=ROOT, env=env, text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.logs: dict[int, Path] = {}
        self.timed_out: set[int] = set()

    def _ask(self, request: dict) -> dict:
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, f"fault driver died (rc {self.proc.poll()})"
        return json.loads(line)

    def start(self, output: Path, overrides: list[str], **faults) -> int:
        """A training run of ``animegamer.phases.run.run`` into ``output``, with the given faults."""
        output.mkdir(parents=True, exist_ok=True)
        log = output.parent / f"{output.name}.{len(list(output.parent.glob(output.name + '.*.log')))}.log"
        request = {"op": "start", "overrides": [*overrides, f"output_dir={output}"], "log": str(log), **faults}
        pid = self._ask(request)["pid"]
        self.logs[pid] = log
        return pid

    def launch(self, script: Path, args: list[str], log: Path, session: bool = False) -> int:
        """``python script args...``, its stdout and stderr to ``log``."""
        log.parent.mkdir(parents=True, exist_ok=True)
        pid = self._ask({"op": "start", "script": str(script), "args": args, "log": str(log),
                         "session": session})["pid"]
        self.logs[pid] = log
        return pid

    def wait(self, pid: int, timeout: float | None = None) -> int:
        """The child's exit code; one killed past ``timeout`` is noted in ``timed_out``."""
        answer = self._ask({"op": "wait", "pid": pid, "timeout": timeout})
        if answer["timed_out"]:
            self.timed_out.add(pid)
        return answer["rc"]

    def run(self, output: Path, overrides: list[str], expect: int = 0, **faults) -> str:
        pid = self.start(output, overrides, **faults)
        rc = self.wait(pid)
        text = self.logs[pid].read_text()
        assert rc == expect, f"exit {rc}, expected {expect}:\n{text[-4000:]}"
        return text

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def running(pid: int) -> bool:
    """The driver's child has not exited (a zombie until the driver reaps it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


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
                while len(received) < pause.get("times", 1) and time.monotonic() < deadline:
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

        def on_train_end(self, trainer, pl_module) -> None:
            self._at("on_train_end", trainer)

    return Fault()


def _install_faults(request: dict) -> None:
    import torch

    from animegamer.phases import run as runner

    kill, pause = request.get("kill"), request.get("pause")
    if kill or pause:
        make_trainer = runner.make_trainer
        fault = _fault_callback(kill, pause, request["log"] + ".ready")
        runner.make_trainer = lambda cfg, callbacks, **kw: make_trainer(cfg, [*callbacks, fault], **kw)
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
        if request.get("session"):
            os.setsid()
        if "script" in request:
            # as the interpreter runs a script: its folder first on the path, no module spec
            sys.argv = [request["script"], *request["args"]]
            sys.path.insert(0, os.path.dirname(request["script"]))
            runpy.run_path(request["script"], run_name="__main__")
        else:
            from animegamer.config.compose import compose_config
            from animegamer.errors import exit_on_user_error
            from animegamer.phases.run import run

            _install_faults(request)
            exit_on_user_error(run)(compose_config("train", request["overrides"]))  # as the train command runs it
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

    import animegamer.cli.train  # noqa: F401
    import animegamer.config.compose  # noqa: F401
    import animegamer.data.phase_a  # noqa: F401
    import animegamer.data.phase_b  # noqa: F401
    import animegamer.data.phase_c  # noqa: F401
    import animegamer.phases.phase_a  # noqa: F401
    import animegamer.phases.phase_b  # noqa: F401
    import animegamer.phases.phase_c  # noqa: F401
    import animegamer.phases.run  # noqa: F401
    # What the networks import when first built (the phases import them lazily): imported here once, so
    # that no forked run imports them again.
    from diffusers import (AutoencoderKLCogVideoX, CogVideoXDDIMScheduler, CogVideoXDPMScheduler,  # noqa: F401
                           CogVideoXTransformer3DModel)
    from diffusers.models.embeddings import TimestepEmbedding, Timesteps  # noqa: F401
    from diffusers.utils.torch_utils import randn_tensor  # noqa: F401
    from peft import LoraConfig, get_peft_model  # noqa: F401
    from transformers import ByT5Tokenizer, DynamicCache, T5EncoderModel  # noqa: F401
    from transformers.models.mistral.modeling_mistral import MistralDecoderLayer  # noqa: F401

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
            pid, timeout = request["pid"], request.get("timeout")
            deadline = None if timeout is None else time.monotonic() + timeout
            done, status = os.waitpid(pid, 0 if deadline is None else os.WNOHANG)
            while not done and time.monotonic() < deadline:
                time.sleep(0.05)
                done, status = os.waitpid(pid, os.WNOHANG)
            if not done:
                if os.getpgid(pid) == pid:  # a session of its own: what it started goes too
                    os.killpg(pid, signal.SIGKILL)
                else:
                    os.kill(pid, signal.SIGKILL)
                _, status = os.waitpid(pid, 0)
            answer({"rc": os.waitstatus_to_exitcode(status), "timed_out": not done})


if __name__ == "__main__":
    main()
