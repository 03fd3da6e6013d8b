"""CPU throughput of the clip pipeline (no captioning, no precompute) beside a naive baseline.

    python benchmarks/pipeline_cpu.py [--width 1280 --height 720 --seconds 60 --repeats 3]

Both run in this process on one core (decoders, OpenCV and torch limited to one thread) over the
same generated film, writing 17-frame 480x720 clips. The framework decodes shots at low width with
the decoder's own scaler, decodes clip frames already scaled to the output, and measures flow at
``analysis_width``; the baseline decodes every frame at full resolution for both passes and
computes flow at full output resolution. Reported: film-seconds per wall-second (median of repeats).
"""
from __future__ import annotations

import argparse
import json
import logging
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import cv2
import numpy as np

from animegamer.config.schema import PipelineConfig
from animegamer.media.flow import clip_flow
from animegamer.media.video import encode_mp4
from animegamer.utils.logging import setup_logging
from data_pipeline.clips import center_crop, cover_size, plan_windows
from data_pipeline.ingest import probe
from data_pipeline.process import plan_film, run_task
from data_pipeline.shots import make_detector, shots_from_cuts
from data_pipeline.toyfilm import make_toy_film

log = logging.getLogger("benchmark")


def framework(film_path: Path, cfg: PipelineConfig, out: Path) -> int:
    """The real pipeline code path (plan + tasks), single process."""
    plan = plan_film(str(film_path), "film", cfg, str(out))
    for task in range(len(plan["tasks"])):
        run_task("film", task, cfg, str(out))
    return plan["num_clips"]


def naive(film_path: Path, cfg: PipelineConfig) -> int:
    """Full-resolution decode for shots and clips, full-resolution flow: the obvious first version."""
    import decord
    from scenedetect import FrameTimecode

    film = probe(film_path, "film", cfg.ingest, cfg.clips)
    reader = decord.VideoReader(str(film_path), num_threads=1)
    detector = make_detector(cfg.shots)
    cuts = []
    for start in range(0, len(reader), 64):
        indices = list(range(start, min(len(reader), start + 64)))
        for i, frame in zip(indices, reader.get_batch(indices).asnumpy()):
            cuts += detector.process_frame(FrameTimecode(i, fps=film.fps), np.ascontiguousarray(frame[..., ::-1]))
    cut_frames = sorted({int(c.frame_num) for c in cuts if 0 < int(c.frame_num) < film.num_frames})
    windows = plan_windows(film, shots_from_cuts(cut_frames, film.num_frames), cfg.clips)
    size = cover_size(film.width, film.height, cfg.clips.width, cfg.clips.height)
    full_res_flow = replace(cfg.motion, analysis_width=cfg.clips.width)
    for window in windows:
        frames = reader.get_batch(list(window.frame_indices)).asnumpy()
        frames = np.stack([cv2.resize(f, size, interpolation=cv2.INTER_AREA) for f in frames])
        frames = np.ascontiguousarray(center_crop(frames, cfg.clips.height, cfg.clips.width))
        clip_flow(frames, full_res_flow)
        encode_mp4(frames, cfg.clips.fps, cfg.clips)
    return len(windows)


def timed(fn, *args) -> tuple[float, int]:
    start = time.perf_counter()
    clips = fn(*args)
    return time.perf_counter() - start, clips


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=720)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    setup_logging("WARNING")
    cv2.setNumThreads(1)
    import torch

    torch.set_num_threads(1)
    cfg = PipelineConfig(caption=replace(PipelineConfig().caption, backend="none"))
    with tempfile.TemporaryDirectory() as tmp:
        film = make_toy_film(Path(tmp) / "film_src", film_id="film", width=args.width, height=args.height)
        film_seconds = film.duration
        rows = {"framework": [], "naive": []}
        clips = {}
        for repeat in range(args.repeats):
            seconds, clips["framework"] = timed(framework, film.video_path, cfg, Path(tmp) / f"out{repeat}")
            rows["framework"].append(seconds)
            seconds, clips["naive"] = timed(naive, film.video_path, cfg)
            rows["naive"].append(seconds)
    result = {
        "source": f"{args.width}x{args.height} @ {film.fps} fps, {film_seconds:.1f} s",
        "output": f"{cfg.clips.frames} frames {cfg.clips.height}x{cfg.clips.width} @ {cfg.clips.fps} fps",
        "threads": 1,
    }
    for name, times in rows.items():
        median = statistics.median(times)
        result[name] = {"clips": clips[name], "median_s": round(median, 2),
                        "film_seconds_per_second": round(film_seconds / median, 2)}
    result["speedup"] = round(result["framework"]["film_seconds_per_second"] / result["naive"]["film_seconds_per_second"], 2)
    print(json.dumps(result, indent=2))  # the benchmark's report is its output
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
