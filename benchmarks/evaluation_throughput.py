"""Evaluation throughput: game turns per hour with ``evaluation.batch_games`` games advancing together, at
paper sizes with random weights on one GPU (``benchmarks/game_turn.py``'s framework side: ``compose``,
``build_framework``).

    python benchmarks/evaluation_throughput.py --tokenizer ../shared/reference/animegamer_tokenizer  # one H200, < 4 min
    python benchmarks/evaluation_throughput.py --tiny                                               # CPU smoke test

For each batch size B (``--batches``, default 1 2 4 8) B fresh games, each with 4 played turns in its
history (every timed turn has the full 5-turn window) and its own instruction per turn, play
``--warmup`` + ``--rounds`` rounds of ``play_turns``: one turn of every game, the MLLM prefill and
greedy states batched over the B games (left padded), the sampler on the batch (CFG doubles it to 2B),
the VAE decode on the batch. The MLLM decodes constrained to the state grammar
(``model.mllm.constrained_states``), so the random MLLM's states are valid and the batched MLLM path
runs as evaluation runs it. Eager decoder, cuDNN attention first (the config's default).

Per B: median seconds per round and per stage (a stage's seconds for the whole batch), turns per hour
(B x 3600 / round), peak GPU memory. ``--steps`` bounds the sampling steps (default 10; the config has
50): ``at_config_steps`` scales the measured sampling stage to the config's step count (seconds per
step x steps) and adds the measured mllm and vae_decode stages, so its turns per hour are estimates
(the JSON marks them). ``speedup`` is turns per hour against B = 1, measured and at the config's steps.
``equal_to_alone``: game 0's first turn at batch B against the same turn at B = 1 (the same seeds and
history): its states, and its frames' max |diff| in 8-bit levels (bf16 kernels may differ by batch).

Bounds: ``--deadline`` (default 220 s, building included) stops the run; a batch size starts only when
the previous one's rounds, scaled by the batch ratio, fit in what is left, and runs under an alarm of
the time left. A batch size that runs out of memory is recorded and ends the sweep. The JSON
(``$OUT/evaluation_throughput.json``, else ``benchmarks/results/``, or ``--out``) is rewritten after
every round.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _device import add_tokenizer_argument, official_tokenizer, run_stamp  # noqa: E402
from animegamer.game.models import play_dtype  # noqa: E402
from game_turn import (HISTORY_TURNS, STATES, SideTimeout, build_framework, compose,  # noqa: E402
                       instruction, time_limit)

RESULTS = Path(__file__).resolve().parent / "results"
STAGES = ("mllm", "sample", "vae_decode")


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def new_games(args, cfg, models, batch: int) -> list:
    """``batch`` games on the built-in (batched) MLLM, each with the same 4 played turns in its history."""
    from animegamer.game.turns import Game
    from animegamer.mllm.predict import HistoryTurn
    from animegamer.mllm.sequence import Turn
    from animegamer.models.encoder import representation_tokens

    n, d = representation_tokens(cfg.model.encoder), cfg.model.encoder.width
    games = []
    for _ in range(batch):
        generator = torch.Generator().manual_seed(1)
        game = Game(models, seed=cfg.seed, window_turns=HISTORY_TURNS + 1, sampling_steps=args.steps)
        # benchmark set-up through the private list
        game._history.extend(HistoryTurn(Turn(instruction(k), STATES[k]), torch.randn(n, d, generator=generator))
                             for k in range(HISTORY_TURNS))
        games.append(game)
    return games


def game_text(game_number: int, turn: int) -> str:
    """Each game its own instructions (unequal prompt lengths: the MLLM batch is left padded)."""
    return instruction(HISTORY_TURNS + turn) + " Then again." * (game_number % 3)


def run_batch(args, cfg, models, batch: int, record: dict, reference: dict) -> None:
    from animegamer.game.turns import play_turns

    games = new_games(args, cfg, models, batch)
    record.update(rounds=[], steps=games[0].diffusion.sampling_steps)
    if args.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    for k in range(args.warmup + args.rounds):
        sync(args.device)
        t0 = time.perf_counter()
        outcomes = play_turns(games, [game_text(g, k) for g in range(batch)])
        seconds = time.perf_counter() - t0
        failed = [str(o) for o in outcomes if isinstance(o, Exception)]
        if failed:
            raise RuntimeError(f"batch {batch}: {len(failed)} turns failed: {failed[0]}")
        # a turn's timings are its share of each batched stage: times B, the stage's seconds
        stages = {s: round(outcomes[0].timings[s] * batch, 4) for s in STAGES}
        record["rounds"].append({"seconds": round(seconds, 4), **stages})
        if k == 0:
            first = outcomes[0]
            if batch == 1:
                reference.update(predicted=first.predicted, frames=first.frames)
            elif reference:
                diff = np.abs(first.frames.astype(np.int16) - reference["frames"].astype(np.int16))
                record["equal_to_alone"] = {"states": first.predicted == reference["predicted"],
                                            "frames_max_diff": int(diff.max()),
                                            "frames_mean_diff": round(float(diff.mean()), 4)}
        measured = record["rounds"][args.warmup:]
        if measured:
            summarise(args, cfg, batch, measured, record)
        if args.device.startswith("cuda"):
            record["peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        args.save()
        print(f"batch {batch} round {k}: {record['rounds'][-1]}", flush=True)


def summarise(args, cfg, batch: int, measured: list[dict], record: dict) -> None:
    median = {key: round(statistics.median(r[key] for r in measured), 4) for key in ("seconds", *STAGES)}
    steps, config_steps = record["steps"], cfg.model.diffusion.sampling_steps
    scaled_round = median["mllm"] + median["sample"] / steps * config_steps + median["vae_decode"]
    record.update(median=median, turns_per_hour=round(batch * 3600 / median["seconds"], 1),
                  seconds_per_turn=round(median["seconds"] / batch, 4),
                  at_config_steps={"steps": config_steps, "estimated": config_steps != steps,
                                   "round_s": round(scaled_round, 4),
                                   "turns_per_hour": round(batch * 3600 / scaled_round, 1)})


def speedups(runs: dict) -> dict:
    base = runs.get("1")
    if not base or "turns_per_hour" not in base:
        return {}
    out = {}
    for batch, row in runs.items():
        if "turns_per_hour" in row:
            out[batch] = {"measured": round(row["turns_per_hour"] / base["turns_per_hour"], 3),
                          "at_config_steps": round(row["at_config_steps"]["turns_per_hour"]
                                                   / base["at_config_steps"]["turns_per_hour"], 3)}
    return out


def main() -> None:
    started = time.perf_counter()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="tiny configs on the CPU, 2 sampling steps")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8], help="games played at once")
    parser.add_argument("--steps", type=int, default=10, help="sampling steps (the config has 50)")
    parser.add_argument("--rounds", type=int, default=2, help="measured rounds (one turn of every game) per batch")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--deadline", type=int, default=220, help="seconds for the whole run, building included")
    add_tokenizer_argument(parser)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    args.tokenizer = official_tokenizer(args.tokenizer, args.tiny)
    if sorted(set(args.batches)) != args.batches or args.batches[0] != 1:
        parser.error("--batches: increasing, starting at 1 (the baseline)")
    args.attention, args.compile, args.compile_mode, args.vae_cudnn_benchmark, args.mllm_compile = (
        None, False, "default", False, False)
    args.device = "cpu" if args.tiny or not torch.cuda.is_available() else "cuda"
    args.dtype = play_dtype(args.device)
    if args.tiny:
        args.steps = 2
    folder = Path(os.environ["OUT"]) if os.environ.get("OUT") else RESULTS
    out = args.out or folder / ("evaluation_throughput_tiny.json" if args.tiny else "evaluation_throughput.json")

    def left() -> float:
        return args.deadline - (time.perf_counter() - started)

    results = {**run_stamp(), "how": " ".join(["python benchmarks/evaluation_throughput.py", *sys.argv[1:]]),
               "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu", "torch": torch.__version__,
               "dtype": str(args.dtype).removeprefix("torch."), "tiny": args.tiny, "warmup": args.warmup,
               "measured_rounds": args.rounds, "runs": {}}

    def save() -> None:
        results["speedup"] = speedups(results["runs"])
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=2))

    args.save = save
    cfg = compose(args)
    cfg.model.mllm.constrained_states = True  # valid states from a random MLLM: every turn is rendered
    results["tokenizer"] = cfg.model.mllm.tokenizer or "byte tokenizer (--tokenizer byte)"
    t0 = time.perf_counter()
    models = build_framework(args, cfg)
    sync(args.device)
    results["build_s"] = round(time.perf_counter() - t0, 1)
    save()

    reference: dict = {}
    previous = None  # (batch, seconds of its rounds)
    for batch in args.batches:
        record = results["runs"][str(batch)] = {}
        if previous is not None:
            estimate = previous[1] * batch / previous[0]
            if estimate > left():
                record["skipped"] = f"estimated {estimate:.0f} s, {left():.0f} s left"
                save()
                break
        t0 = time.perf_counter()
        try:
            with time_limit(max(1, int(left()))), torch.no_grad():
                run_batch(args, cfg, models, batch, record, reference)
        except (SideTimeout, torch.OutOfMemoryError, RuntimeError) as error:
            record["error"] = f"{type(error).__name__}: {error}"[:500]
            print(f"batch {batch}: {record['error']}", file=sys.stderr, flush=True)
            save()
            break
        finally:
            gc.collect()
            if args.device == "cuda":
                torch.cuda.empty_cache()
        previous = (batch, time.perf_counter() - t0)
        save()
    save()
    print(json.dumps(results, indent=2))
    for batch, row in results["runs"].items():
        if "turns_per_hour" in row:
            print(f"batch {batch}: {row['turns_per_hour']} turns/h at {row['steps']} steps, "
                  f"{row['at_config_steps']['turns_per_hour']} at {row['at_config_steps']['steps']} (estimated); "
                  f"speedup {results['speedup'].get(batch)}; peak {row.get('peak_gib')} GiB", flush=True)


if __name__ == "__main__":
    main()
