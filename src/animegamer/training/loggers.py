"""The ``logger/`` group: wandb (offline by default), TensorBoard, CSV or nothing."""
from __future__ import annotations

from pathlib import Path

from animegamer.config.schema import RunConfig
from animegamer.utils.io import first_free

# Lightning's loggers are imported where a run makes one, so that this module's choices can be read
# (configuration checks) without loading Lightning.
LOGGERS = ("wandb", "tensorboard", "csv", "none")
CSV_METRICS = "metrics.csv"


def keep_earlier_attempt(path: Path) -> None:
    """Lightning's CSV logger empties its folder's metrics.csv when a resumed run writes: keep the
    earlier attempt's rows as metrics.attempt-N.csv first (rank 0 only, before any rank starts)."""
    from lightning.pytorch.utilities import rank_zero_only

    if rank_zero_only.rank != 0 or not path.is_file():
        return
    path.rename(first_free(lambda n: path.with_name(f"{path.stem}.attempt-{n}{path.suffix}")))


def make_logger(cfg: RunConfig):
    out = Path(cfg.output_dir)
    kind = cfg.logger.kind
    if kind == "none":
        return False
    if kind == "csv":
        from lightning.pytorch.loggers import CSVLogger

        keep_earlier_attempt(out / "logs" / CSV_METRICS)
        return CSVLogger(str(out), name="logs", version="")
    if kind == "tensorboard":
        from lightning.pytorch.loggers import TensorBoardLogger

        return TensorBoardLogger(str(out), name="tensorboard", version="")
    if kind == "wandb":
        from lightning.pytorch.loggers import WandbLogger

        return WandbLogger(project=cfg.logger.project, save_dir=str(out), offline=cfg.logger.offline,
                           name=Path(cfg.output_dir).name)
    raise ValueError(f"logger.kind={kind!r} is not one of {LOGGERS}")
