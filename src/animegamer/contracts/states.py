"""The game state a turn carries (clip shards' ``states``, session shards' turns, the MLLM's state tokens,
the game's bars, the evaluation's accuracies): its keys in sequence order, their labels and the values
each may take."""
from __future__ import annotations

from animegamer.config.schema import NUM_MOTION_LEVELS

MOTION_LEVEL = "ML"  # the motion level, 1..NUM_MOTION_LEVELS (from the clip's flow, not its caption)
SOCIAL = "SC"
ENTERTAINMENT = "ET"
STAMINA = "ST"
STATE_KEYS: tuple[str, ...] = (MOTION_LEVEL, SOCIAL, ENTERTAINMENT, STAMINA)  # in sequence order
CHARACTER_STATES: tuple[str, ...] = (SOCIAL, ENTERTAINMENT, STAMINA)  # what a caption says, the bars the player sees
STATE_LABELS: dict[str, str] = {SOCIAL: "Social", ENTERTAINMENT: "Entertainment", STAMINA: "Stamina"}
# The paper's state changes: social and entertainment either rise (1) or not (0); stamina is
# always spent (-1) or recovered (+1), never unchanged.
STATE_ALLOWED_VALUES: dict[str, tuple[int, ...]] = {SOCIAL: (0, 1), ENTERTAINMENT: (0, 1), STAMINA: (-1, 1)}
ML_RANGE = (1, NUM_MOTION_LEVELS)
# A played turn's record in game.json: the states its MLLM generated (ML and the deltas, what a training
# turn's ``states`` hold); its bars before and after the turn are kept beside them.
PLAYED_STATES = "predicted"
