"""Paper-scale runs of ``train.py`` under the distributed presets, with a kill and a resume.

For each phase and strategy, on random weights of the true sizes and synthetic shards of the true
shapes (``tests/synthetic.py``, the training tests' shards):

- 1 GPU, global batch G: train to M/2 steps, stop, then run again to M (save, resume, continue);
  with ``--parallel`` the 1-GPU runs of the strategies share out the host's GPUs, one run per GPU;
- k GPUs (k > 1), global batch G (G/k per GPU): SIGKILL the whole process group once the checkpoint
  of step K is complete and a few more steps ran, restart, finish at N.

Reported per run: median samples/s, tokens/s, MFU and step time from the throughput log, peak GPU
memory, and the resumed run's per-step loss against the 1-GPU run (same global batch: with the
randomness keyed by global sample position, the curves agree up to bf16 reduction order).

    python benchmarks/strategies.py --phases a_joint b c --strategies deepspeed_stage_2 fsdp --gpus 1 2
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "benchmarks"), str(ROOT / "tests")]  # tests/: synthetic.py

# Names from the contracts, not animegamer.phases or animegamer.training: those import Lightning, which this
# driver (and every script importing it) need not load; the training runs it launches load it themselves.
from animegamer.config.compose import path_override  # noqa: E402  (no Lightning, no torch)
from animegamer.contracts.checkpoint_names import CHECKPOINT_DIR, checkpoint_name, is_complete  # noqa: E402
from animegamer.contracts.exports import A_JOINT, PHASE_B, PHASE_C  # noqa: E402  (after the path set-up)

PRESETS = {"gpu": "gpu", "ddp": "ddp", "deepspeed_stage_2": "deepspeed_zero2", "deepspeed_stage_2_offload": "deepspeed_zero2_offload",
           "fsdp": "fsdp"}
EXPERIMENTS = {A_JOINT: "paper_a_joint", PHASE_B: "paper_b", PHASE_C: "paper_c"}


TINY = ["model=tiny", "pipeline.clips.height=32", "pipeline.clips.width=48"]  # --tiny: a CPU rehearsal


def model_cfg(tiny: bool):
    from omegaconf import OmegaConf

    from animegamer.config.compose import compose_config

    return OmegaConf.to_object(compose_config("train", TINY if tiny else ["model=paper"]))


def make_data(phase: str, root: Path, samples: int, tiny: bool) -> Path:
    import synthetic
    from animegamer.models.encoder import representation_tokens

    cfg = model_cfg(tiny)
    root.mkdir(parents=True, exist_ok=True)
    clips, enc = cfg.pipeline.clips, cfg.model.encoders
    n, d = representation_tokens(cfg.model.encoder), cfg.model.encoder.width
    if phase == A_JOINT:
        return synthetic.feature_shards(root, enc, samples, clips.frames, clips.height, clips.width)
    if phase == PHASE_B:
        return synthetic.session_shards(root, samples, 5, n, d)
    from animegamer.config.validate import vae_latent_shape

    latents = vae_latent_shape(enc, clips.frames, clips.height, clips.width)
    return synthetic.adaptation_shards(root, samples, latents, (n, d))


def overrides(args, phase: str, strategy: str, gpus: int, data: Path, out: Path, steps: int) -> list[str]:
    found = [f"experiment={EXPERIMENTS[phase]}", f"trainer={PRESETS[strategy]}", f"trainer.devices={gpus}",
             "model.mllm.path=''", "model.decoder.path=''", "model.encoders.vae.path=''", "model.encoders.t5.path=''",
             "model.encoders.clip.path=''", "phase.init_from=''", "logger=csv", path_override("data.root", data),
             path_override("output_dir", out), f"phase.max_steps={steps}",
             f"phase.batch_size={args.global_batch[phase] // gpus}",
             "phase.warmup_steps=5", "phase.val_every_n_steps=1000000", "phase.val_clips=0",
             f"checkpoint.every_n_steps={args.checkpoint_every}", "trainer.log_every_n_steps=5",
             f"trainer.throughput_every_n_steps={getattr(args, 'throughput_every', 5)}",
             f"trainer.peak_tflops={args.peak}", "data.num_workers=4"]
    if args.tiny:
        found += TINY + ["trainer.accelerator=cpu", "trainer.precision=32-true", "data.num_workers=0"]
    elif phase == "b":
        found += [path_override("model.mllm.tokenizer", args.tokenizer)] if args.tokenizer else []  # '': bytes
        found += ["model.mllm.gradient_checkpointing=true"]
    return found + list(args.extra)


_LIVE: set[subprocess.Popen] = set()  # training process groups this driver started and has not reaped
_STOPPING = threading.Event()  # set by stop_children: no new launches


def launch(cmd: list[str], log: Path, gpu: int | None = None) -> subprocess.Popen:
    if _STOPPING.is_set():
        raise RuntimeError("the driver is stopping")
    pinned = {} if gpu is None else {"CUDA_VISIBLE_DEVICES": visible_gpus()[gpu]}
    env = {**os.environ, **pinned, "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}:{os.environ.get('PYTHONPATH', '')}",
           "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
    # Own process group, so a kill reaches every rank; stop_children() ends them if the driver is stopped.
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=open(log, "ab"), stderr=subprocess.STDOUT,
                            start_new_session=True)
    _LIVE.add(proc)
    if _STOPPING.is_set():  # stopped between the check above and the registration: end it here
        os.killpg(proc.pid, signal.SIGKILL)
        raise RuntimeError("the driver is stopping")
    return proc


def visible_gpus() -> list[str]:
    """The GPU ids this driver may hand out: its own CUDA_VISIBLE_DEVICES, else 0..N-1."""
    found = os.environ.get("CUDA_VISIBLE_DEVICES")
    if found:
        return [g.strip() for g in found.split(",") if g.strip()]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())] or ["0"]


def stop_children(signum=None, frame=None) -> None:
    """SIGKILL every training process group still running. Installed for SIGTERM/SIGINT: a driver
    stopped by ``timeout`` must not leave a run on the GPUs that the next measurement then shares."""
    _STOPPING.set()
    for proc in list(_LIVE):
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    if signum is not None:
        sys.exit(128 + signum)


def wait(proc: subprocess.Popen, log: Path, limit: float) -> int:
    try:
        code = proc.wait(timeout=limit)
        _LIVE.discard(proc)
        return code
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise RuntimeError(f"timed out; log tail:\n{log.read_text()[-3000:]}")


def metric_rows(out: Path) -> list[dict]:
    """Every row of the run's CSV training logs, earlier attempts' included."""
    return [r for path in sorted((out / "logs").glob("metrics*.csv")) for r in csv.DictReader(open(path))]


def saved_and_logged(folder: Path, step: int) -> bool:
    """The checkpoint of ``step`` is complete and its save row has reached the training log: a kill
    before the log's flush would lose the launch's rows (its start-up time among them)."""
    if not is_complete(folder / CHECKPOINT_DIR / checkpoint_name(step)):
        return False
    try:
        return any(r.get("ckpt/save_s") and int(float(r["step"])) == step for r in metric_rows(folder))
    except (OSError, ValueError, KeyError, csv.Error):  # the file is being written: look again
        return False


def train(args, phase, strategy, gpus, data, out, steps, kill_at: int | None = None, gpu: int | None = None) -> dict:
    cmd = [sys.executable, str(ROOT / "train.py"), *overrides(args, phase, strategy, gpus, data, out, steps)]
    log = out.with_suffix(".log")
    out.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    # Progress as it happens: a driver stopped by an outer time limit still shows how far each run got.
    note = lambda what: print(f"[{time.perf_counter() - started:6.0f} s] {out.name} to step {steps}: {what}", flush=True)
    note("launched")
    proc = launch(cmd, log, gpu)
    killed = False
    if kill_at is not None:
        while proc.poll() is None and not saved_and_logged(out, kill_at):
            time.sleep(0.5)
        time.sleep(args.kill_delay)  # a few steps past the checkpoint: they are lost and redone
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            killed = True
            note(f"killed after the step-{kill_at} checkpoint; relaunched")
            proc = launch(cmd, log, gpu)
    code = wait(proc, log, args.run_timeout)
    note(f"exit {code}")
    if code != 0:
        raise RuntimeError(f"exit {code}; log tail:\n{log.read_text()[-4000:]}")
    return {"seconds": round(time.perf_counter() - started, 1), "killed": killed}


def perf(out: Path) -> dict:
    """Medians of the throughput rows after the first (warm-up) one; every save's seconds and GiB
    (``ckpt/save_*``) and every launch's seconds to its first step (``perf/startup_s``, fresh or resumed)."""
    every = metric_rows(out)
    rows = [r for r in every if r.get("perf/step_s")]
    found = {}
    for key in ("perf/samples_per_s", "perf/tokens_per_s", "perf/mfu", "perf/step_s", "perf/peak_mem_gib"):
        values = [float(r[key]) for r in rows[1:] if r.get(key)] or [float(r[key]) for r in rows if r.get(key)]
        if values:
            found[key.removeprefix("perf/")] = round(statistics.median(values), 4)
    saves = [(int(r["step"]), round(float(r["ckpt/save_s"]), 2), round(float(r["ckpt/save_gib"]), 3))
             for r in every if r.get("ckpt/save_s")]
    if saves:
        found["saves"] = saves  # (step, seconds, GiB)
    starts = [(bool(float(r["perf/resumed"])), round(float(r["perf/startup_s"]), 1)) for r in every
              if r.get("perf/startup_s")]
    if starts:
        found["startups"] = starts  # (resumed, seconds to the first step), one per launch
    return found


def losses(out: Path) -> dict[int, float]:
    """global step -> loss of the step's global batch: the mean over every rank's micro-batches
    (each rank writes loss_history[.rankN].json; equal local batches make the mean exact)."""
    by_step: dict[int, list[float]] = {}
    for path in sorted(out.glob("loss_history*.json")):
        for step, _, loss in json.loads(path.read_text()):
            by_step.setdefault(step, []).append(loss)
    return {s: sum(v) / len(v) for s, v in by_step.items()}


def compare(reference: dict[int, float], other: dict[int, float]) -> dict:
    common = sorted(set(reference) & set(other))
    diffs = [abs(other[s] - reference[s]) / max(abs(reference[s]), 1e-6) for s in common]
    return {"steps": len(common), "max_rel_diff": round(max(diffs), 5) if diffs else None,
            "median_rel_diff": round(statistics.median(diffs), 5) if diffs else None}


def main() -> None:
    from _device import add_tokenizer_argument, official_tokenizer

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--phases", nargs="+", default=list(EXPERIMENTS), choices=list(EXPERIMENTS))
    parser.add_argument("--strategies", nargs="+", default=["deepspeed_stage_2", "fsdp"], choices=list(PRESETS))
    parser.add_argument("--gpus", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--one-gpu-steps", type=int, default=0, help="steps of the 1-GPU runs (0 = --steps)")
    parser.add_argument("--parallel", type=int, default=0, help="GPUs to share the 1-GPU runs out over (0 = in turn)")
    parser.add_argument("--checkpoint-every", type=int, default=25)
    parser.add_argument("--kill-after-checkpoint", type=int, default=50, help="step whose checkpoint precedes the kill")
    parser.add_argument("--kill-delay", type=float, default=5.0)
    parser.add_argument("--batch", nargs="+", default=["a_joint=2", "b=4", "c=2"], help="global batch per phase")
    parser.add_argument("--samples", type=int, default=32)
    parser.add_argument("--peak", type=float, default=0.0, help="bf16 TFLOP/s (0 = measure)")
    add_tokenizer_argument(parser)
    parser.add_argument("--run-timeout", type=float, default=900)
    parser.add_argument("--work", type=Path, default=Path("/tmp/strategies"))
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")) / "strategies.json")
    parser.add_argument("--extra", nargs="*", default=[], help="more overrides for every run")
    parser.add_argument("--tiny", action="store_true", help="tiny models on CPU (rehearse the driver; ddp only)")
    args = parser.parse_args()
    args.tokenizer = official_tokenizer(args.tokenizer, args.tiny, needed=PHASE_B in args.phases)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stop_children)
    args.global_batch = {k: int(v) for k, v in (item.split("=") for item in args.batch)}
    if not args.peak and not args.tiny:
        from _device import measure_bf16_peak

        args.peak = round(measure_bf16_peak("cuda")["tflops"], 1)
    results = json.loads(args.out.read_text()) if args.out.exists() else {}
    results.setdefault("runs", {})
    results.update(peak_tflops=args.peak, steps=args.steps, global_batch=args.global_batch)

    for phase in args.phases:
        data = make_data(phase, args.work / "data" / phase, args.samples, args.tiny)
        single = [(phase, strategy, 1) for strategy in args.strategies] if 1 in args.gpus else []
        on_free_gpus(single, args.parallel, lambda job, gpu: run_one(args, results, data, *job, gpu=gpu))
        for strategy in args.strategies:
            for gpus in sorted(g for g in args.gpus if g > 1):
                run_one(args, results, data, phase, strategy, gpus)
        save(args, results)


def on_free_gpus(jobs: list, gpus: int, run) -> None:
    """``run(job, gpu)`` for every job, one job per GPU at a time over ``gpus`` GPUs (each process sees
    only its own: CUDA_VISIBLE_DEVICES); ``gpus`` = 0: in turn, on whatever the process sees."""
    if not gpus:
        for job in jobs:
            run(job, None)
        return
    from concurrent.futures import ThreadPoolExecutor
    from queue import Queue

    if gpus > len(visible_gpus()):
        raise ValueError(f"--parallel {gpus}: only {len(visible_gpus())} GPU(s) visible ({visible_gpus()})")
    free: Queue = Queue()
    for gpu in range(gpus):
        free.put(gpu)

    def on_a_free_gpu(job) -> None:
        if _STOPPING.is_set():  # the driver was stopped: queued jobs do not start
            return
        gpu = free.get()
        try:
            run(job, gpu)
        finally:
            free.put(gpu)

    with ThreadPoolExecutor(gpus) as pool:
        list(pool.map(on_a_free_gpu, jobs))


_SAVING = threading.Lock()  # runs on several GPUs record into one results dict


def save(args, results: dict, name: str | None = None, record: dict | None = None) -> None:
    """Record ``results["runs"][name] = record`` (when given) and write the file: under one lock, and
    through a temporary file, so neither a concurrent run nor a stop leaves a torn file."""
    with _SAVING:
        if name is not None:
            results["runs"][name] = record
        text = json.dumps(results, indent=2)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        partial = args.out.with_name(args.out.name + ".partial")
        partial.write_text(text)
        os.replace(partial, args.out)


RECORD = "driver_record.json"  # in a run's folder: its overrides and result, for a restarted driver


def run_one(args, results: dict, data: Path, phase: str, strategy: str, gpus: int, gpu: int | None = None) -> None:
    """One run (1 GPU: stop and resume; k GPUs: killed and restarted), recorded into ``results``. A run
    that an earlier driver finished with the same overrides is reused, not repeated."""
    name = f"{phase}:{strategy}:{gpus}gpu"
    out = args.work / "runs" / name.replace(":", "_")
    steps = (args.one_gpu_steps or args.steps) if gpus == 1 else args.steps
    key = {"overrides": overrides(args, phase, strategy, gpus, data, out, steps),
           "stop_at": steps // 2 if gpus == 1 else None, "kill_at": None if gpus == 1 else args.kill_after_checkpoint}
    stored = json.loads((out / RECORD).read_text()) if (out / RECORD).is_file() else {}
    if stored.get("key") == key:
        record = {**stored["record"], "reused": True}
    else:
        # From an empty folder: a stale checkpoint (an earlier driver stopped mid-run, other overrides)
        # would be resumed and its metrics reported as this run's.
        shutil.rmtree(out, ignore_errors=True)
        out.with_suffix(".log").unlink(missing_ok=True)
        record = measure(args, results, data, phase, strategy, gpus, gpu, out, steps)
        if "error" not in record:
            (out / RECORD).write_text(json.dumps({"key": key, "record": record}))
    print(name, json.dumps({k: v for k, v in record.items() if k != "error"}), record.get("error", "")[-1500:],
          flush=True)
    save(args, results, name, record)


def measure(args, results: dict, data: Path, phase: str, strategy: str, gpus: int, gpu: int | None, out: Path,
            steps: int) -> dict:
    record = {"phase": phase, "strategy": strategy, "gpus": gpus, "global_batch": args.global_batch[phase],
              "extra": list(args.extra)}
    try:
        if gpus == 1:  # save, stop, resume, continue
            record["first_half"] = train(args, phase, strategy, gpus, data, out, steps // 2, gpu=gpu)
            record["resumed"] = train(args, phase, strategy, gpus, data, out, steps, gpu=gpu)
        else:  # killed after a checkpoint, restarted
            record["run"] = train(args, phase, strategy, gpus, data, out, steps, kill_at=args.kill_after_checkpoint)
        record["perf"] = perf(out)
        curve = losses(out)
        record["loss_first_last"] = [round(curve[min(curve)], 4), round(curve[max(curve)], 4)]
        record["steps_logged"] = len(curve)
        record["loss_curve"] = {step: round(loss, 6) for step, loss in sorted(curve.items())}
        if gpus > 1:
            reference_dir = args.work / "runs" / f"{phase}_{strategy}_1gpu"
            if reference_dir.is_dir():
                record["vs_1gpu"] = compare(losses(reference_dir), curve)
            with _SAVING:
                base = dict(results["runs"].get(f"{phase}:{strategy}:1gpu", {}).get("perf", {}))
            # perf/* is rank 0's view, i.e. per GPU: efficiency = per-GPU throughput ratio.
            if base.get("samples_per_s") and record["perf"].get("samples_per_s"):
                record["scaling_efficiency"] = round(record["perf"]["samples_per_s"] / base["samples_per_s"], 3)
    except Exception as error:  # noqa: BLE001 - keep the other runs
        record["error"] = str(error)[-3000:]
    return record


if __name__ == "__main__":
    main()
