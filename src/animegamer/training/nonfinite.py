"""Steps whose gradient norm is not finite: skipped, counted, and the run stopped past the allowed run of them.

Every strategy's clipping path reports each optimizer step here (``phases.common.clip_gradients``, and the
DeepSpeed strategy for the steps its engine skipped), so ``trainer.max_nonfinite_in_row`` holds alike.
"""
from __future__ import annotations

import logging

log = logging.getLogger(__name__)


def count_step(module, finite: bool, norm: float, max_nonfinite_in_row: int) -> None:
    """Count an optimizer step whose gradient norm was ``finite`` or not (then it is skipped: the caller
    drops its gradients, or the engine did); raise :class:`FloatingPointError` once more than
    ``max_nonfinite_in_row`` steps in a row were not finite. ``module.skipped_steps`` counts them all."""
    if finite:
        module.nonfinite_in_row = 0
        return
    module.nonfinite_in_row = getattr(module, "nonfinite_in_row", 0) + 1
    module.skipped_steps = getattr(module, "skipped_steps", 0) + 1
    log.warning("step %d: gradient norm is %s; step skipped (%d in a row, limit %d)", module.global_step,
                norm, module.nonfinite_in_row, max_nonfinite_in_row)
    if module.nonfinite_in_row > max_nonfinite_in_row:
        raise FloatingPointError(f"non-finite gradients in {module.nonfinite_in_row} steps in a row at step "
                                 f"{module.global_step} (trainer.max_nonfinite_in_row={max_nonfinite_in_row}): "
                                 "lower the learning rate or inspect the data of these steps")
