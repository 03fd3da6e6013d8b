"""The MLLM judge's record as metrics.json keeps it, and how it is shown: its six dimensions and score range,
the cell of one score and report.md's "Table 2: MLLM judge" section.

The judge (:mod:`animegamer.evaluation.judge`) writes the record; the report and the ranking page read it,
without the judge's client, prompt or clip decoding.
"""
from __future__ import annotations

from typing import Mapping

from animegamer.evaluation.drawing import markdown_row
from animegamer.metrics.common import format_metric

DIMENSIONS = ("overall", "instruction_following", "contextual_consistency", "character_consistency",
              "style_consistency", "state_update")
DIMENSION_LABELS = {
    "overall": "Overall",
    "instruction_following": "Instruction following",
    "contextual_consistency": "Contextual consistency",
    "character_consistency": "Character consistency",
    "style_consistency": "Style consistency",
    "state_update": "State update",
}
SCORE_RANGE = (1, 10)
SCORE_DECIMALS = 2
PAPER_JUDGE_MODEL = "GPT-4V"
SETTINGS = "evaluation.judge"  # the config node, as messages name it


def game_reason(game: Mapping) -> str:
    """Why a game is unscored (records written before games carried their ``reason``: the last error)."""
    return game.get("reason") or (game["samples"][-1]["error"] if game.get("samples") else "not judged")


def judge_cell(record: Mapping, key: str) -> str:
    """"6.50 ± 0.71" (mean ± judge spread), "6.50" with one sample, or "n/a (reason)"."""
    text = format_metric(record["scores"][key], SCORE_DECIMALS)
    spread = record["spread"].get(key)
    if spread is None or not record["scores"][key]["available"]:
        return text
    return f"{text} ± {spread:.{SCORE_DECIMALS}f}"


def table2_lines(record: Mapping) -> list[str]:
    """report.md's "Table 2: MLLM judge" section for one evaluation (table cells escaped: a reason quotes
    the judge's answer, which may hold a ``|``)."""
    model = f"`{record['model']}`" if record.get("model") else "none"
    lines = ["## Table 2: MLLM judge", "",
             f"Judge: {model}; prompt version {record['prompt_version']} (sha256 {record['prompt_sha256']}); "
             f"{record['games_scored']} of {record['games']} games scored, {record['samples_per_game']} samples per "
             f"game, {record['frames_per_turn']} frames per turn.", "",
             f"| Dimension | Ours (mean ± sd) | Paper ({PAPER_JUDGE_MODEL}) |", "|---|---|---|"]
    lines += [markdown_row(DIMENSION_LABELS[key], judge_cell(record, key), "not recorded") for key in DIMENSIONS]
    failed = [g for g in record.get("per_game", []) if g["mean"] is None]
    lines += ["", f"Scores from {SCORE_RANGE[0]} to {SCORE_RANGE[1]}, higher is better. A game's score is the mean "
              "of its valid samples; ours is the mean over the scored games, ± the mean over games of the samples' "
              "standard deviation (the judge's own spread). The paper's judge prompt is not public: ours is "
              "`src/animegamer/templates/judge_prompt.txt.j2`, so ours and the paper's scores come from different "
              "prompts (and judges, unless ours is GPT-4V). The repository does not record the paper's Table 2 "
              "numbers."]
    if record.get("budget_exhausted"):
        lines += ["", f"The judge's request budget ({SETTINGS}.budget_s = {record['budget_s']:g} s) ran out: the "
                  "games judged after that are not scored."]
    if failed:
        lines += ["", "Games without a valid judgement (not scored, not a zero): "
                  + "; ".join(f"{g['id']}: {game_reason(g)}" for g in failed) + "."]
    return lines
