"""A game's character states and the record of a played turn."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping, Optional

import numpy as np

from animegamer.contracts.states import CHARACTER_STATES, PLAYED_STATES

if TYPE_CHECKING:  # the state rule is read without torch (the judge and the ranking page use it)
    import torch

INITIAL_STATE = 50  # official demo
STATE_STEP = 5  # one unit of predicted delta moves a bar by 5
STATE_RANGE = (0, 100)


def clip_name(index: int) -> str:
    return f"turn_{index:03d}.mp4"


# --------------------------------------------------------------------------- states
def update_states(states: Mapping[str, int], predicted: Mapping[str, int]) -> dict[str, int]:
    """``clamp(value + 5 * delta, 0, 100)`` for SC, ET and ST (the official demo's rule)."""
    low, high = STATE_RANGE
    return {k: max(low, min(high, int(states[k]) + STATE_STEP * int(predicted[k]))) for k in CHARACTER_STATES}


@dataclass
class TurnResult:
    index: int  # 0-based turn number
    instruction: str
    tokens: list[int]  # the generated state tokens
    token_text: Optional[str]  # their readable form
    predicted: dict[str, int]  # ML, SC, ET, ST as generated
    states_before: dict[str, int]  # SC, ET, ST
    states_after: dict[str, int]
    motion_level: int
    flow: float
    seed: int  # the turn's sampler seed
    frames: np.ndarray  # (T, H, W, 3) uint8
    rep: torch.Tensor  # (N, D) float32, CPU
    timings: dict[str, float]  # seconds: mllm, sample, vae_decode, total

    def to_record(self) -> dict:
        """What game.json keeps of the turn (no frames, no representation)."""
        return {"index": self.index, "instruction": self.instruction, "video": clip_name(self.index),
                "tokens": list(self.tokens), "token_text": self.token_text, PLAYED_STATES: dict(self.predicted),
                "states_before": dict(self.states_before), "states_after": dict(self.states_after),
                "motion_level": self.motion_level, "flow": self.flow, "seed": self.seed,
                "frames": list(self.frames.shape), "timings": {k: round(v, 4) for k, v in self.timings.items()}}
