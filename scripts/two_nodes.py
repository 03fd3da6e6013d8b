"""One ``train.py`` run started as two torchrun "nodes" on this host, the way two machines start it,
with an optional node failure: node 1 SIGKILLed after a checkpoint, then both nodes started again.

    python scripts/two_nodes.py --log-dir LOGS [--gpus-per-node 1] [--kill-after STEP] -- OVERRIDES...

Each node is docs/distributed.md's multi-node command, ``torchrun --nnodes 2 --nproc-per-node P --node-rank R
--master-addr 127.0.0.1 --master-port PORT train.py OVERRIDES trainer.num_nodes=2 trainer.devices=P``
(static rendezvous: node 0's agent hosts the store, node 1 connects to it), with its own stdout/stderr log
``LOGS/launch-I.node-R.log``. With ``--gpus-per-node P`` (> 0) node R sees only GPUs R*P..R*P+P-1, as a
machine sees only its own; with 0 each node runs one CPU process (Lightning then uses gloo).

The port: one outside the kernel's ephemeral range (so no socket another program opened with port 0
can hold it), checked free; node 0 alone binds it, so a program that takes it in between makes node 0
fail with EADDRINUSE, and then both nodes are stopped and started again on another port, once.

A node failure kills the node's torchrun agent and every process under it (torchrun starts its workers
in their own sessions, so a process-group kill would leave them running), a few moments after the
checkpoint of ``--kill-after`` is complete. The surviving node is waited for and SIGKILLed after
``--survivor-limit`` seconds if it has not stopped: under gloo its next collective fails at once
(connection reset), under NCCL it waits on the dead peer until the process group's timeout (30 min by
default), as a scheduler would not. Both nodes are then started again with the same overrides and
resume from the newest checkpoint.

Prints, and writes to ``LOGS/two_nodes.json``: each launch's exit codes and seconds, the kill, how long
the survivor took to stop, and the checkpoint the restart resumed from.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from animegamer.contracts.checkpoint_names import CHECKPOINT_DIR, checkpoint_name, is_complete  # noqa: E402

NODES = 2
HOST = "127.0.0.1"
PORT_FLOOR = 20000  # lowest port tried; below the kernel's ephemeral range (read from /proc)
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
DEFAULT_EPHEMERAL_LOW = 32768  # Linux's default lower bound, when /proc cannot be read
PORT_IN_USE = "EADDRINUSE"  # what node 0's TCPStore reports when its port was taken
LAUNCH_ATTEMPTS = 2  # a taken port: stopped and started again on another port, once
POLL_S = 0.05
RESUMED = re.compile(r"resuming from (\S+)")
# NVLink multicast stays off on shared GPU hosts (it can take the host's GPUs out of service).
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}

log = logging.getLogger("two_nodes")


def pick_port() -> int:
    """A free port below the ephemeral range: ports that the kernel hands out for port 0 (which test
    runners and other launchers use) never collide with it."""
    try:
        low = int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = DEFAULT_EPHEMERAL_LOW
    candidates = list(range(PORT_FLOOR, max(low, PORT_FLOOR + 1)))
    random.shuffle(candidates)
    for port in candidates:
        with socket.socket() as probe:
            try:
                probe.bind((HOST, port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {PORT_FLOOR}..{low - 1} on {HOST}")


def node_command(node: int, port: int, procs: int, overrides: list[str]) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", f"--nnodes={NODES}", f"--nproc-per-node={procs}",
            f"--node-rank={node}", f"--master-addr={HOST}", f"--master-port={port}", "--max-restarts=0",
            str(ROOT / "train.py"), *overrides, f"trainer.num_nodes={NODES}", f"trainer.devices={procs}"]


def node_env(node: int, gpus_per_node: int) -> dict[str, str]:
    env = {**os.environ, **NO_MULTICAST,
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    if gpus_per_node:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        ids = visible.split(",") if visible else [str(i) for i in range(NODES * gpus_per_node)]
        mine = ids[node * gpus_per_node:(node + 1) * gpus_per_node]
        if len(mine) < gpus_per_node:
            raise RuntimeError(f"node {node} needs {gpus_per_node} GPU(s); visible: {ids}")
        env["CUDA_VISIBLE_DEVICES"] = ",".join(mine)
    return env


def descendants(pid: int) -> list[int]:
    """``pid`` and every process under it (Linux /proc), parents first."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # exited meanwhile
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ')'
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        current = todo.pop(0)
        found.append(current)
        todo.extend(children.get(current, []))
    return found


def kill_node(proc: subprocess.Popen) -> None:
    """SIGKILL the node's agent and everything under it at once, as a machine failing would."""
    for pid in descendants(proc.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()


class Launch:
    """Both nodes of one start, each in its own session with its own log."""

    def __init__(self, overrides: list[str], log_dir: Path, index: int, gpus_per_node: int):
        self.overrides, self.log_dir, self.index, self.gpus_per_node = overrides, log_dir, index, gpus_per_node
        self.nodes: list[subprocess.Popen] = []
        self.logs: list[Path] = []
        self.started = time.monotonic()

    def start(self, port: int) -> None:
        self.started = time.monotonic()
        self.logs = [self.log_dir / f"launch-{self.index}.node-{node}.log" for node in range(NODES)]
        procs = max(self.gpus_per_node, 1)
        for node, path in enumerate(self.logs):
            with open(path, "ab") as out:
                self.nodes.append(subprocess.Popen(node_command(node, port, procs, self.overrides), cwd=ROOT,
                                                   env=node_env(node, self.gpus_per_node), stdout=out,
                                                   stderr=subprocess.STDOUT, start_new_session=True))
        log.info("launch %d: both nodes started on port %d", self.index, port)

    def text(self, node: int) -> str:
        return self.logs[node].read_text(errors="replace") if self.logs[node].exists() else ""

    def stop(self) -> None:
        for proc in self.nodes:
            if proc.poll() is None:
                kill_node(proc)

    def port_taken(self) -> bool:
        return self.nodes[0].poll() not in (None, 0) and PORT_IN_USE in self.text(0)

    def wait(self, deadline: float) -> list[int]:
        while any(p.poll() is None for p in self.nodes):
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"launch {self.index} still running at its time limit; "
                                   f"node 0 log tail:\n{self.text(0)[-3000:]}")
            if self.port_taken():
                self.stop()
                break
            time.sleep(POLL_S)
        return [p.returncode for p in self.nodes]


def start(overrides: list[str], log_dir: Path, index: int, gpus_per_node: int, until: float,
          ready=None) -> tuple[Launch, list[int] | None]:
    """Start both nodes (again on another port if node 0's was taken). With ``ready`` (a predicate),
    return as soon as it holds and both nodes still run (codes None); otherwise wait for the end."""
    for attempt in range(LAUNCH_ATTEMPTS):
        launch = Launch(overrides, log_dir, index, gpus_per_node)
        launch.start(pick_port())
        while ready is not None and not ready() and all(p.poll() is None for p in launch.nodes):
            if time.monotonic() > until:
                launch.stop()
                raise TimeoutError(f"launch {index}: not ready by its time limit; node 0 log tail:\n"
                                   f"{launch.text(0)[-3000:]}")
            time.sleep(POLL_S)
        if ready is not None and all(p.poll() is None for p in launch.nodes):
            return launch, None
        codes = launch.wait(until)
        if launch.port_taken() and attempt + 1 < LAUNCH_ATTEMPTS:
            log.warning("launch %d: node 0's port was taken; both nodes started again", index)
            continue
        return launch, codes
    raise AssertionError("unreachable: the last attempt returns")


def output_dir(overrides: list[str]) -> Path:
    found = [o.split("=", 1)[1] for o in overrides if o.startswith("output_dir=")]
    if not found:
        raise ValueError("two_nodes.py needs output_dir=... among the overrides (the kill waits for its checkpoint)")
    return Path(found[-1])


def checkpoint_ready(folder: Path, step: int):
    path = folder / CHECKPOINT_DIR / checkpoint_name(step)
    return lambda: is_complete(path)


def run(overrides: list[str], log_dir: Path, gpus_per_node: int = 0, kill_after: int | None = None,
        kill_delay: float = 0.0, limit_s: float = 900.0, survivor_limit_s: float = 120.0) -> dict:
    """The run (optionally with node 1 killed after ``kill_after``'s checkpoint and both restarted);
    raises when a launch that must finish fails."""
    log_dir.mkdir(parents=True, exist_ok=True)
    until = time.monotonic() + limit_s
    record: dict = {"overrides": overrides, "gpus_per_node": gpus_per_node, "launches": []}
    ready = checkpoint_ready(output_dir(overrides), kill_after) if kill_after is not None else None
    launch, codes = start(overrides, log_dir, 0, gpus_per_node, until, ready)
    if codes is None:  # node 1 dies a moment after the checkpoint: the steps since are lost
        time.sleep(kill_delay)
        killed_at = time.monotonic()
        kill_node(launch.nodes[1])
        survivor = launch.nodes[0]
        try:
            survivor.wait(timeout=survivor_limit_s)
            stopped_by_itself = True
        except subprocess.TimeoutExpired:
            kill_node(survivor)
            stopped_by_itself = False
        record["kill"] = {"after_checkpoint": kill_after, "node": 1, "node_1_code": launch.nodes[1].returncode,
                          "node_0_code": survivor.returncode, "node_0_stopped_by_itself": stopped_by_itself,
                          "node_0_stop_s": round(time.monotonic() - killed_at, 1)}
        record["launches"].append(_summary(launch, [p.returncode for p in launch.nodes]))
        log.info("node 1 killed after the step-%d checkpoint; node 0 %s after %.1f s (exit %s)", kill_after,
                 "stopped" if stopped_by_itself else "was killed", record["kill"]["node_0_stop_s"], survivor.returncode)
        launch, codes = start(overrides, log_dir, 1, gpus_per_node, until)
    elif kill_after is not None:
        record["kill"] = None  # the run ended before the checkpoint it waited for
    record["launches"].append(_summary(launch, codes))
    resumed = RESUMED.search(launch.text(0))
    record["resumed_from"] = resumed.group(1) if resumed else None
    (log_dir / "two_nodes.json").write_text(json.dumps(record, indent=2))
    if any(codes):
        raise RuntimeError(f"launch {launch.index} failed (exit codes {codes}); node 0 log tail:\n"
                           f"{launch.text(0)[-3000:]}\nnode 1 log tail:\n{launch.text(1)[-2000:]}")
    return record


def _summary(launch: Launch, codes: list[int]) -> dict:
    return {"index": launch.index, "codes": codes, "seconds": round(time.monotonic() - launch.started, 1),
            "logs": [str(p) for p in launch.logs]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--log-dir", type=Path, required=True)
    parser.add_argument("--gpus-per-node", type=int, default=0, help="0: one CPU process per node")
    parser.add_argument("--kill-after", type=int, default=None, help="kill node 1 once this step's checkpoint is complete")
    parser.add_argument("--kill-delay", type=float, default=0.0, help="seconds between the checkpoint and the kill")
    parser.add_argument("--limit", type=float, default=900.0, help="seconds for everything")
    parser.add_argument("--survivor-limit", type=float, default=120.0,
                        help="seconds node 0 gets to stop by itself after node 1 is killed")
    parser.add_argument("overrides", nargs="*", help="train.py overrides (after --)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    record = run(args.overrides, args.log_dir, args.gpus_per_node, args.kill_after, args.kill_delay, args.limit,
                 args.survivor_limit)
    print(json.dumps(record))


if __name__ == "__main__":
    main()
