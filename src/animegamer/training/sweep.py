"""Run folders of a Hydra sweep: under ``--multirun`` each job trains into its own sub-folder.

Experiments fix ``output_dir`` (``outputs/paper/table3/<variant>/<phase>``, e.g.
``outputs/paper/table3/addition/a_joint``), so the jobs of
``train.py --multirun experiment=ablation_a_addition model=tiny,paper`` would share one folder. Each
job's folder is ``<output_dir>/<its overrides>`` (Hydra's ``hydra.job.override_dirname``, e.g.
``experiment=ablation_a_addition,model=tiny``): distinct for distinct jobs, and the same when the same
sweep is started again, so a re-run sweep resumes each job in its own folder.
"""
from __future__ import annotations

from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode

from animegamer.utils.io import sha256_bytes

MAX_NAME = 150  # file systems allow 255 bytes a name; long override lists end in a hash instead
HASH_CHARS = 16


def job_folder_name(override_dirname: str, job_num: int) -> str:
    """A folder name from a job's overrides ('/' in path values becomes '_'); ``job<N>`` when it has none."""
    name = override_dirname.replace("/", "_") or f"job{job_num}"
    if len(name.encode()) > MAX_NAME:
        name = name.encode()[: MAX_NAME - HASH_CHARS - 1].decode(errors="ignore") + "-" + \
            sha256_bytes(name.encode())[:HASH_CHARS]
    return name


def job_output_dir(output_dir: str) -> str:
    """``output_dir`` of this process: unchanged outside a Hydra multirun, a per-job sub-folder inside one."""
    if not HydraConfig.initialized():
        return output_dir
    hydra = HydraConfig.get()
    if hydra.mode != RunMode.MULTIRUN:
        return output_dir
    return str(Path(output_dir) / job_folder_name(hydra.job.override_dirname, hydra.job.num))
