"""The ``logger/`` group: wandb (offline by default), TensorBoard, CSV or nothing."""
from __future__ import annotations

from pathlib import Path

from animegamer.config.schema import RunConfig

LOGGERS = ("wandb", "tensorboard", "csv", "none")


def make_logger(cfg: RunConfig):
    out = Path(cfg.output_dir)
    kind = cfg.logger.kind
    if kind == "none":
        return False
    if kind == "csv":
        from lightning.pytorch.loggers import CSVLogger

        return CSVLogger(str(out), name="logs", version="")
    if kind == "tensorboard":
        from lightning.pytorch.loggers import TensorBoardLogger

        return TensorBoardLogger(str(out), name="tensorboard", version="")
    if kind == "wandb":
        from lightning.pytorch.loggers import WandbLogger

        return WandbLogger(project=cfg.logger.project, save_dir=str(out), offline=cfg.logger.offline,
                           name=Path(cfg.output_dir).name)
    raise ValueError(f"logger.kind={kind!r} is not one of {LOGGERS}")
