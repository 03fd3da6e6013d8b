"""Reproduce, deterministically, the abort at exit of 2-process gloo runs, and show what prevents it.

    .venv/bin/python scripts/gloo_exit_abort.py             # rank 0 dies: SIGABRT, exit code -6
    .venv/bin/python scripts/gloo_exit_abort.py --teardown  # the group destroyed first: both exit 0

Gloo runs a collective on a worker thread, which drops its references to the collective's tensors after
the caller has moved on. Rank 0 here starts an all-reduce and drops its Python references to the tensor
and the work, so the tensor's Python object is kept alive from C++, and exits. Rank 1 joins the
all-reduce only once rank 0 is inside its last exit handler, which keeps the GIL (a C call) for a while:
rank 0's worker finishes the collective and waits for the GIL to free that Python object. The
interpreter then starts finalizing; when it lets the GIL go, Python ends the waiting thread with
``pthread_exit``, whose forced unwinding through a ``noexcept`` C++ destructor calls ``std::terminate``:
"terminate called without an active exception". In real runs the wait is a worker thread that the
loaded machine has not scheduled before the process exits, so it happens now and then.

``--teardown`` destroys the process group before exiting (what ``animegamer.training.process_group``
does after every training run): that joins gloo's workers while the interpreter is intact.
``TORCH_CUSTOM_TERMINATE=1`` prints the aborting thread's C++ stack (``ProcessGroupGloo::runLoop`` ->
``c10::TensorImpl::decref_pyobject`` -> ``pthread_exit``).
"""
from __future__ import annotations

import atexit
import ctypes
import sys

EXIT_HANDLER_GIL_SECONDS = 4  # how long rank 0's last exit handler keeps the GIL
LATE_SECONDS = 1.0  # rank 1 joins the all-reduce this long after rank 0 started exiting
WORLD = 2

if sys.argv[1:2] == ["--rank"] and sys.argv[2] == "0":
    # Registered before anything else, so it runs last, with no Python code after it to hand the GIL over.
    atexit.register(ctypes.PyDLL(None).usleep, EXIT_HANDLER_GIL_SECONDS * 1_000_000)

import argparse  # noqa: E402 - after the exit handler above, on purpose
import os  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402


def rank_main(rank: int, folder: Path, teardown: bool) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=(folder / "rendezvous").as_uri(), rank=rank, world_size=WORLD)
    exiting = folder / "rank0_exiting"
    if rank == 0:
        tensor = torch.ones(1000)
        work = dist.all_reduce(tensor, async_op=True)
        del tensor, work  # the in-flight work now holds the tensor, and C++ its Python object
        exiting.touch()
        if teardown:
            dist.destroy_process_group()  # joins the workers: they finish the all-reduce first
        return
    while not exiting.exists():
        time.sleep(0.05)
    time.sleep(LATE_SECONDS)
    dist.all_reduce(torch.ones(1000))
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--teardown", action="store_true", help="destroy the process group before exiting")
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--folder", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank is not None:
        rank_main(args.rank, args.folder, args.teardown)
        return 0
    with tempfile.TemporaryDirectory() as folder:
        extra = ["--teardown"] if args.teardown else []
        ranks = [subprocess.Popen([sys.executable, __file__, "--rank", str(rank), "--folder", folder, *extra],
                                  stderr=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
                 for rank in range(WORLD)]
        ended = [(rank.wait(), rank.stderr.read()) for rank in ranks]
    for rank, (code, stderr) in enumerate(ended):
        said = [line for line in stderr.splitlines() if "terminate" in line]
        print(f"rank {rank}: exit code {code}" + (f" ({said[-1].strip()})" if said else ""))
    return 0 if all(code == 0 for code, _ in ended) else 1


if __name__ == "__main__":
    sys.exit(main())
