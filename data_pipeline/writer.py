"""Writer: motion bins over all staged clips, webdataset clip shards, manifest and human report."""
from __future__ import annotations

import json
from contextlib import contextmanager
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

import webdataset as wds
from tqdm import tqdm

from animegamer.config.schema import PipelineConfig
from animegamer.contracts.files import CLIPS_DIR, MANIFEST, SHOTS_FILE
from animegamer.contracts.shards import CAPTIONER, FILM, FLOW, JSON, KEY, LEVEL, MOTION, MP4, SHOT, SOURCE, STATUS
from animegamer.data.lineage import MADE_FROM
from animegamer.data.split import shot_id
from animegamer.errors import UserError
from animegamer.media.captions import STATUS_OK
from animegamer.media.fingerprint import FINGERPRINT
from animegamer.media.motion_bins import LEVELS, MotionBins, compute_bins
from animegamer.utils.command import recorded_command
from animegamer.utils.io import atomic_path, sha256_file, write_json_atomic
from data_pipeline.fingerprint import plan_fingerprint, task_fingerprints
from data_pipeline.ingest import broken_links
from data_pipeline.lineage import built_summary, output_path
from data_pipeline.staging import Staging

log = logging.getLogger(__name__)

REPORT = "report.json"
HISTOGRAM = "motion_levels.png"
SHARD_PATTERN = "shard-{:06d}.tar"
# Fixed tar metadata: shards must be byte-identical whenever their contents are.
TAR_MTIME = 0.0
FORMAT_VERSION = 1


@dataclass
class Collected:
    """Everything the staging area says about the assigned inputs."""

    clips: list[tuple[str, Path, dict]] = field(default_factory=list)
    sources: list[dict] = field(default_factory=list)
    skipped: list[dict] = field(default_factory=list)
    failed_tasks: list[dict] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)


def _add_timings(total: dict[str, float], part: dict[str, float]) -> None:
    for name, seconds in part.items():
        total[name] = total.get(name, 0.0) + seconds


def collect(staging: Staging, films: dict[str, str], cfg: PipelineConfig, captioner) -> Collected:
    """Gather the staged results of ``films`` (source path -> film id) that the current settings,
    input files and caption source made (their fingerprints), sorted by film id and key. Anything
    staged under other fingerprints counts as pending: it is never gathered into shards. A film's
    path is where it is now (its staged work may have been made from a copy at another path)."""
    out = Collected()
    for path, film_id in sorted(films.items(), key=lambda item: item[1]):
        plan_fp = plan_fingerprint(path, cfg, staging.hash_cache)
        rejection = staging.rejection(path, plan_fp)
        if rejection is not None:
            out.skipped.append({k: v for k, v in rejection.items() if k != FINGERPRINT})
            continue
        plan = staging.plan(film_id, plan_fp)
        if plan is None:
            out.pending.append(path)
            continue
        film = {**plan["film"], "path": path}
        out.sources.append({k: film[k] for k in ("film_id", "path", "size", "sha256", "fps", "num_frames", "width", "height")})
        _add_timings(out.timings, plan["timings"])
        for task in range(len(plan["tasks"])):
            task_fp, caption_fp = task_fingerprints(plan, task, cfg, captioner)
            captions = staging.captions(film_id, task, caption_fp)
            if staging.task_done(film_id, task, task_fp) and captions is not None:
                _add_timings(out.timings, staging.task_info(film_id, task)["timings"])
                _add_timings(out.timings, captions["timings"])
                out.clips.extend((key, mp4, {**meta, SOURCE: Path(path).name, **captions["captions"][key]})
                                 for key, mp4, meta in staging.task_clips(film_id, task))
            elif (error := staging.task_error(film_id, task, caption_fp)) is not None:
                out.failed_tasks.append({k: error[k] for k in ("film_id", "task", "reason", "detail")})
            else:
                out.pending.append(f"{path} (task {task})")
    return out


def with_levels(clips: list[tuple[str, Path, dict]], bins: MotionBins) -> list[tuple[str, Path, dict]]:
    return [(key, mp4, {**meta, MOTION: {**meta[MOTION], LEVEL: bins.level(meta[MOTION][FLOW])}})
            for key, mp4, meta in clips]


@contextmanager
def shard_writer(path: Path) -> Iterator[wds.TarWriter]:
    """A webdataset TarWriter whose shard appears at ``path`` only when complete, with fixed tar
    metadata so equal contents give equal bytes. Every shard set of the pipeline is written this way."""
    with atomic_path(path) as tmp, open(tmp, "wb") as stream:
        with wds.TarWriter(stream, encoder=False, mtime=TAR_MTIME) as tar:
            yield tar


def write_shard(path: Path, samples: Iterable[dict]) -> dict:
    """One shard of webdataset records (:func:`shard_writer`); returns its manifest entry: name, count
    and sha256."""
    count = 0
    with shard_writer(path) as tar:
        for sample in samples:
            tar.write(sample)
            count += 1
    return {"name": path.name, "count": count, "sha256": sha256_file(path)}


def write_numbered_shards(items: Sequence, out_dir: Path, maxcount: int, samples: Callable[[Sequence], Iterable[dict]],
                          desc: str) -> list[dict]:
    """``items`` in order, ``maxcount`` to a shard named :data:`SHARD_PATTERN` by its number;
    ``samples(group)`` gives the records of one shard's items. Returns the shards' manifest entries."""
    groups = [items[i : i + maxcount] for i in range(0, len(items), maxcount)]
    return [write_shard(out_dir / SHARD_PATTERN.format(number), samples(group))
            for number, group in enumerate(tqdm(groups, desc=desc, unit="shard", disable=None))]


def write_step_manifest(root: Path, step: str, resolved: dict, lineage: tuple[dict, str], counts: dict,
                        shards: list[dict], **fields) -> dict:
    """The manifest of a derived shard set (kind = its step, the command and config, what it was made
    from, its fingerprint, ``fields``, the counts and shards), written into its folder last, so a set
    is current only once complete; returns the step's summary."""
    sources, step_fp = lineage
    manifest = {"kind": step, "command": recorded_command(), "config": resolved, **fields, MADE_FROM: sources,
                FINGERPRINT: step_fp, "counts": counts, "shards": shards}
    write_json_atomic(output_path(root, step) / MANIFEST, manifest)
    return built_summary(root, step, counts)


def _clip_records(group: Sequence[tuple[str, Path, dict]]) -> Iterator[dict]:
    for key, mp4_path, meta in group:
        yield {"__key__": key, JSON: json.dumps(meta, sort_keys=True).encode(), MP4: mp4_path.read_bytes()}


def write_shards(clips: list[tuple[str, Path, dict]], out_dir: Path, maxcount: int) -> list[dict]:
    """Clip shards in key order; each shard renamed into place only when complete."""
    out_dir.mkdir(parents=True, exist_ok=True)
    shards = write_numbered_shards(clips, out_dir, maxcount, _clip_records, "shards")
    for stale in sorted(out_dir.glob("shard-*.tar"))[len(shards):]:
        stale.unlink()  # a previous run with more clips: its extra shards are no longer valid
    return shards


def save_histogram(bins: MotionBins, flows: list[float], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.2))
    left.bar([str(l) for l in LEVELS], [bins.counts.get(l, 0) for l in LEVELS], color="tab:blue")
    left.set(title="clips per motion level", xlabel="level")
    right.hist(flows, bins=40, color="tab:gray")
    for edge in bins.edges:
        right.axvline(edge, color="tab:red", linewidth=1)
    right.set(title=f"clip flow ({bins.source} edges in red)", xlabel="mean flow (px/frame)")
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)


def finalize(cfg: PipelineConfig, resolved_config: dict, films: dict[str, str], extra_report: dict,
             captioner) -> dict:
    """Write clip shards, manifest and report for ``films``; raises if some input is unfinished.

    ``captioner``: the run's caption backend (its version is part of each task's fingerprint)."""
    root = Path(cfg.output)
    collected = collect(Staging(root), films, cfg, captioner)
    collected.skipped += [broken.to_json() for broken in broken_links(cfg.inputs, cfg.ingest.extensions)]
    if collected.pending:
        raise RuntimeError(
            f"{len(collected.pending)} inputs are not processed yet with the current settings and files "
            "(other parts still running, or the process step not run since a change?): "
            + ", ".join(collected.pending[:10])
        )
    flows = [meta[MOTION][FLOW] for _, _, meta in collected.clips]
    bins = compute_bins(flows, cfg.motion)
    clips = with_levels(collected.clips, bins)
    shards = write_shards(clips, root / CLIPS_DIR, cfg.writer.maxcount)
    failed_captions = [meta[KEY] for _, _, meta in clips if meta[CAPTIONER][STATUS] != STATUS_OK]
    manifest = {
        "kind": "clips",
        "format_version": FORMAT_VERSION,
        "command": recorded_command(),
        "config": resolved_config,
        "sources": collected.sources,
        "counts": {"films": len(collected.sources), "clips": len(clips), "skipped_inputs": len(collected.skipped),
                   "caption_failed": len(failed_captions), "shards": len(shards)},
        "motion_bins": bins.to_json(),
        "shards": shards,
    }
    # The held-out split is by shot (animegamer.data.split): every reader needs each clip's shot.
    write_json_atomic(root / CLIPS_DIR / SHOTS_FILE, {m[KEY]: shot_id(m[FILM], m[SHOT]) for _, _, m in clips})
    write_json_atomic(root / CLIPS_DIR / MANIFEST, manifest)
    if cfg.writer.report_histogram and clips:
        save_histogram(bins, flows, root / HISTOGRAM)
    report = {
        "output": str(root / CLIPS_DIR),
        "counts": manifest["counts"],
        "motion_bins": manifest["motion_bins"],
        "skipped_inputs": collected.skipped,
        "failed_tasks": collected.failed_tasks,
        "caption_failed": failed_captions,
        "seconds_per_stage": {k: round(v, 3) for k, v in sorted(collected.timings.items())},
        "film_seconds": sum(s["num_frames"] / s["fps"] for s in collected.sources),
        **extra_report,
    }
    write_json_atomic(root / REPORT, report)
    if not clips:
        raise_no_clips(root / REPORT, len(films), collected.skipped, collected.failed_tasks)
    return report


SHOWN = 10  # inputs named in a message; the report names them all


def raise_no_clips(report_path: Path, inputs: int, skipped: list[dict], failed_tasks: list) -> None:
    """Stop before any later step reads empty shards: which inputs were skipped and why, how many tasks
    failed (the report holds the details); the other inputs were read and are shorter than one clip's
    window or have no shot long enough."""
    why = "; ".join(f"{s.get('path', s.get('film_id'))}: {s.get('reason')}" for s in skipped[:SHOWN])
    more = f"; and {len(skipped) - SHOWN} more" if len(skipped) > SHOWN else ""
    parts = [f"{len(skipped)} skipped ({why}{more})"] if skipped else []
    if failed_tasks:
        parts.append(f"{len(failed_tasks)} clip task(s) failed (report.json's failed_tasks)")
    if not failed_tasks and inputs > len(skipped):
        parts.append(f"{inputs - len(skipped)} read but too short, or without a shot long enough for one clip "
                     f"(pipeline.clips and pipeline.shots settings)")
    raise UserError(f"no clips from {inputs} input(s): {', '.join(parts)}; details in {report_path}")
