"""An evaluation run again with nothing changed is read back instead of played again.

``animegamer eval`` run again, and the recipes and the known-answer benchmark, which evaluate after their
stages (themselves reused when finished), would otherwise replay every finished evaluation (minutes of
sampling). An evaluation folder therefore keeps ``evaluation_record.json``, written once its
metrics are: the fingerprint of the resolved evaluation config, the content of the exports it scored
(``export.json`` and ``trained.safetensors`` of the MLLM, renderer and reconstruction exports) and the
data's clip manifest, and the files it wrote. The next call with the same fingerprint and the metrics in
place returns them; any difference (a setting, a retrained export, clips cut again) plays it again. A
change of code is not seen: delete the folder to replay it.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable

from omegaconf import OmegaConf

from animegamer.checkpoints.export import EXPORT_FILE, TRAINED_FILE
from animegamer.checkpoints.trained_data import clip_manifest_sha256
from animegamer.contracts.files import METRICS_FILE
from animegamer.evaluation import runner
from animegamer.evaluation.record import RECORD_FILE, forget_record
from animegamer.evaluation.report import read_evaluation
from animegamer.media.fingerprint import fingerprint
from animegamer.utils.io import read_json_if_exists, sha256_file, write_json_atomic

log = logging.getLogger(__name__)

SCORED_EXPORTS = ("mllm_export", "renderer_export", "reconstruction_export")


def export_identity(folder: str) -> dict | None:
    """The content digests of an export's record and tensors (None: no export named)."""
    if not folder:
        return None
    path = Path(folder)
    return {name: sha256_file(path / name) if (path / name).is_file() else None for name in (EXPORT_FILE, TRAINED_FILE)}


def evaluation_fingerprint(composed) -> str:
    config = OmegaConf.to_container(composed, resolve=True)
    e = composed.evaluation
    exports = {name: export_identity(str(e[name])) for name in SCORED_EXPORTS}
    return fingerprint(config, exports, clip_manifest_sha256(composed.data.root, composed.data.clips))


def evaluate_or_reuse(composed, play: Callable[[Any], dict] | None = None) -> dict:
    """``play(composed)``'s result (default :func:`animegamer.evaluation.runner.run`): read back when this
    evaluation already ran to its end with the same fingerprint, else played (and its record written after
    its metrics)."""
    out = Path(composed.evaluation.out)
    fp = evaluation_fingerprint(composed)
    record = read_json_if_exists(out / RECORD_FILE)
    if record and record.get("fingerprint") == fp and (out / METRICS_FILE).is_file():
        log.info("evaluation: reused %s (same config, exports and clips; delete its %s to play it again)", out,
                 RECORD_FILE)
        metrics = read_evaluation(out, "the evaluation this record names", ("metrics",))["metrics"]
        return {"metrics": metrics, "files": record["files"], "out": str(out)}
    forget_record(out)  # a replay cut short must not leave the old record valid
    report = (play or runner.run)(composed)
    write_json_atomic(out / RECORD_FILE, {"fingerprint": fp, "files": report["files"]})
    return report


def run(composed) -> dict:
    """What ``animegamer eval`` runs: its pre-flight (every problem at once), then the evaluation, read back
    where it already ran to its end with nothing changed (:func:`evaluate_or_reuse`)."""
    runner.preflight(composed)
    return evaluate_or_reuse(composed, lambda checked: runner.evaluate(OmegaConf.to_object(checked)))
