"""The process group's lifetime around a training run, on every rank: rendezvous and teardown.

Rendezvous. Lightning's launcher picks a free port, closes it, starts the other ranks with it in
``MASTER_PORT``, and rank 0 binds it again when it joins the group; another process may take the port
in between. When this process launches the other ranks itself, :func:`host_rendezvous` binds the
rendezvous store on a port the kernel picks and keeps it bound: torch's ``env://`` rendezvous on rank
0 then reuses that server (``TCPStore``'s multi-tenant servers are shared per port within a process)
instead of binding again, and the other ranks read ``MASTER_PORT`` as before.

Teardown. Gloo runs each collective on a worker thread, which drops its references to the
collective's tensors after the caller has moved on. A tensor whose Python object Python dropped
meanwhile (the temporaries of ``all_gather_object`` or ``broadcast_object_list``) keeps that object
alive from C++, so the worker takes the GIL to free it. If the interpreter starts finalizing while
the worker waits for the GIL, Python ends the thread with ``pthread_exit``, and its forced unwinding
through a ``noexcept`` destructor calls ``std::terminate``: "terminate called without an active
exception", SIGABRT after the run's work is done, now and then, more often when a collective is the
last thing a rank does and the machine is loaded. Lightning never destroys a gloo group, so its
workers live until the interpreter exits. :func:`end_process_group` destroys the group on every rank
while the interpreter is intact, which joins the workers. A group of one process is left to whoever
made it (a caller may run several fits on it); each rank of a multi-process run is a process of its
own, whose launcher starts the others once.
"""
from __future__ import annotations

import contextlib
import gc
import logging
import os
from typing import Iterator

from animegamer.training.faults import SAVED_STOP_CODES

log = logging.getLogger(__name__)

MASTER_PORT = "MASTER_PORT"  # the rendezvous port every rank reads (torch's env:// rendezvous, Lightning)
# The one backend whose group Lightning leaves alive at exit (it destroys NCCL groups in an exit handler).
GLOO = "gloo"

# The store this process hosts for the ranks it launches, with MASTER_PORT's earlier value (None: unset).
_hosted: list[tuple[object, str | None]] = []


def host_rendezvous(trainer) -> None:
    """Bind the rendezvous store before ``trainer`` launches the other ranks of this node, when it does:
    Lightning's subprocess launcher on one node with its default environment, and no ``MASTER_PORT``
    chosen by the user or a scheduler. Released by :func:`end_process_group`."""
    from lightning.fabric.plugins.environments import LightningEnvironment
    from lightning.pytorch.strategies.launchers.subprocess_script import _SubprocessScriptLauncher
    from torch.distributed import TCPStore

    strategy = trainer.strategy
    environment = getattr(strategy, "cluster_environment", None)
    launches = isinstance(getattr(strategy, "launcher", None), _SubprocessScriptLauncher) and \
        isinstance(environment, LightningEnvironment) and not environment.creates_processes_externally
    if not launches or trainer.num_nodes != 1 or MASTER_PORT in os.environ:
        return
    # world_size=None: this store waits for nobody; the rendezvous's own store (the same server) does.
    store = TCPStore(environment.main_address, 0, world_size=None, is_master=True, multi_tenant=True,
                     wait_for_workers=False)
    _hosted.append((store, os.environ.get(MASTER_PORT)))
    os.environ[MASTER_PORT] = str(store.port)
    log.debug("rendezvous store bound on port %d for the ranks this process launches", store.port)


def end_process_group(synchronize: bool) -> None:
    """Destroy the default gloo group of several processes (``synchronize``: after a barrier, when every
    rank ends here together) and release the store :func:`host_rendezvous` bound."""
    import torch.distributed as dist

    try:
        if dist.is_available() and dist.is_initialized() and dist.get_backend() == GLOO and \
                dist.get_world_size() > 1:
            if synchronize:
                dist.barrier()  # every rank has left its last collective before any takes its side down
            # Unreachable wrappers in reference cycles (FSDP's units) still hold the group: collect them,
            # so that destroying it drops the last reference and joins gloo's workers.
            gc.collect()
            dist.destroy_process_group()
    finally:
        while _hosted:
            store, earlier = _hosted.pop()
            del store  # the server closes with its last reference (a live group's store holds one)
            if earlier is None:
                os.environ.pop(MASTER_PORT, None)
            else:
                os.environ[MASTER_PORT] = earlier


@contextlib.contextmanager
def process_group_lifetime() -> Iterator[None]:
    """Around a training run: :func:`end_process_group` when it ends. After a finished run, or a preemption
    (``SystemExit`` with a code of ``SAVED_STOP_CODES``: every rank stopped at the same step and saved together), the
    ranks synchronize first; after a failure they do not, as a peer may never arrive."""
    ended_together = False
    try:
        yield
        ended_together = True
    except SystemExit as stop:
        ended_together = stop.code in SAVED_STOP_CODES
        raise
    finally:
        end_process_group(synchronize=ended_together)
