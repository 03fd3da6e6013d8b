"""The benchmark's experiments: config folders of its own, beside the library's, found through Hydra's
search path.

The library's configs hold the product's experiments; the benchmark's live in ``configs/<folder>/experiment/``,
one folder per root config: its training stages (``known_answer_<size>_{base,a,b,c}``) under ``train``, its
evaluations (``known_answer_<size>_eval``) under ``eval`` and its data sets (``known_answer_<size>``) under
``pipeline``, beside the held-out split every stage and evaluation loads (``known_answer_held_out.yaml``). Every
stage and evaluation builds on its data set, so each root searches the data sets' folder too. A composition
reaches them with :func:`search_path` among its overrides.
"""
from __future__ import annotations

from pathlib import Path

from animegamer.config.compose import quoted

CONFIGS = Path(__file__).resolve().parent / "configs"
TRAIN, EVALUATE, PIPELINE = "train", "evaluate", "pipeline"  # the library's root configs
FOLDERS = {TRAIN: "train", EVALUATE: "eval", PIPELINE: "pipeline"}  # each root's experiments, under CONFIGS
EXPERIMENT_GROUP = "experiment"


def folders(root: str) -> list[Path]:
    """The config folders the root config ``root`` searches: its own experiments' and the data sets'."""
    if root not in FOLDERS:
        raise ValueError(f"unknown root config {root!r}; choose from {sorted(FOLDERS)}")
    return [CONFIGS / name for name in dict.fromkeys((FOLDERS[root], FOLDERS[PIPELINE]))]


def search_path(root: str) -> str:
    """The override that lets the root config ``root`` compose the benchmark's experiments."""
    return "hydra.searchpath=[" + ",".join(quoted(f"file://{folder}") for folder in folders(root)) + "]"


def experiments(root: str) -> list[str]:
    """The names of the root config ``root``'s own experiments (those of its folder)."""
    return sorted(path.stem for path in (folders(root)[0] / EXPERIMENT_GROUP).glob("*.yaml"))
