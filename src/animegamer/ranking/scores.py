"""The scores of a ranking: the paper's 10/7/4/1 per complete ranking, the raters' agreement (Kendall's
W, Spearman's rho) and ``report.md``'s Table 2."""
from __future__ import annotations

import statistics
from typing import Mapping, Optional, Sequence

from animegamer.evaluation.judge_record import DIMENSION_LABELS, DIMENSIONS, judge_cell
from animegamer.ranking.runs import RANK_SCORES, Run
from animegamer.utils.text import count_of

SCORE_DECIMALS = 2
STATUS_COMPLETE, STATUS_INCOMPLETE, STATUS_DUPLICATE = "complete", "incomplete", "duplicate"


def ranking_status(ranks: Mapping[str, int], runs: int) -> tuple[str, str]:
    """(status, text for the rater) of one dimension's ranks."""
    values = list(ranks.values())
    repeated = sorted({v for v in values if values.count(v) > 1})
    if repeated:
        return STATUS_DUPLICATE, f"rank {repeated[0]} is given twice: give each clip its own rank"
    if len(values) == runs:
        return STATUS_COMPLETE, "saved"
    return STATUS_INCOMPLETE, f"saved; {len(values)} of {runs} ranked"


def is_complete(ranks: Mapping[str, int], runs: Sequence[str]) -> bool:
    return set(ranks) == set(runs) and sorted(ranks.values()) == list(range(1, len(runs) + 1))


def spearman(a: Mapping[str, int], b: Mapping[str, int]) -> float:
    """Spearman's rho of two complete rankings of the same items, without ties: 1 - 6 sum d^2 / (n (n^2 - 1))."""
    n = len(a)
    return 1.0 - 6.0 * sum((a[k] - b[k]) ** 2 for k in a) / (n * (n * n - 1))


def kendall_w(rankings: Sequence[Mapping[str, int]]) -> float:
    """Kendall's W of m complete rankings of the same n items, without ties: 12 S / (m^2 (n^3 - n))."""
    m, items = len(rankings), list(rankings[0])
    n = len(items)
    totals = [sum(r[item] for r in rankings) for item in items]
    mean = m * (n + 1) / 2
    return 12.0 * sum((t - mean) ** 2 for t in totals) / (m * m * (n ** 3 - n))


def aggregate(state: Mapping[tuple[str, str, str], Mapping[str, int]], runs: Sequence[str],
              games: Sequence[str]) -> dict:
    """Scores per dimension and run (the mean of 10/7/4/1 over complete rankings), Kendall's W per
    dimension (the mean over games ranked completely by at least two raters), and per rater the mean
    Spearman rho with the other raters over the (game, dimension) pairs both ranked completely."""
    complete = {key: ranks for key, ranks in state.items() if key[1] in games and key[2] in DIMENSIONS
                and is_complete(ranks, runs)}
    raters = sorted({rater for rater, _, _ in complete})
    scores, counts, agreement = {}, {}, {}
    for dimension in DIMENSIONS:
        rows = [ranks for (_, _, d), ranks in complete.items() if d == dimension]
        counts[dimension] = len(rows)
        scores[dimension] = {run: (statistics.mean(RANK_SCORES[r[run] - 1] for r in rows) if rows else None)
                             for run in runs}
        per_game = [[ranks for (_, g, d), ranks in complete.items() if d == dimension and g == game] for game in games]
        ws = [kendall_w(rankings) for rankings in per_game if len(rankings) >= 2]
        agreement[dimension] = {"kendall_w": statistics.mean(ws) if ws else None, "games": len(ws)}
    per_rater = {}
    for rater in raters:
        rhos = [spearman(ranks, complete[(other, game, dimension)])
                for (who, game, dimension), ranks in complete.items() if who == rater
                for other in raters if other != rater and (other, game, dimension) in complete]
        per_rater[rater] = {"rankings": sum(1 for who, _, _ in complete if who == rater),
                            "spearman": statistics.mean(rhos) if rhos else None, "pairs": len(rhos)}
    return {"runs": list(runs), "games": list(games), "rank_scores": list(RANK_SCORES[: len(runs)]),
            "scores": scores, "rankings": counts, "agreement": agreement, "raters": per_rater}


def _number(value: Optional[float], decimals: int = SCORE_DECIMALS) -> str:
    return "-" if value is None else f"{value:.{decimals}f}"


def report_lines(result: Mapping, runs: Sequence[Run]) -> list[str]:
    """report.md: Table 2 with each run's MLLM judge and human scores, then the raters' agreement."""
    names = result["runs"]
    scores_text = "/".join(str(s) for s in result["rank_scores"])
    lines = ["# AnimeGamer human ranking (Table 2)", "",
             f"{len(names)} runs, {len(result['games'])} games, {count_of(len(result['raters']), 'rater')}; a complete "
             f"ranking of a game in a dimension gives ranks 1..{len(names)} the scores {scores_text} (the paper's "
             "mapping), and a run's human score is the mean over complete rankings.", ""]
    lines += [f"- `{run.name}`: {run.folder}" for run in runs] + [""]
    header = "| Dimension | " + " | ".join(f"`{n}` judge | `{n}` human" for n in names) + " | Rankings | Kendall's W |"
    lines += ["## Table 2", "", header, "|---" * (2 * len(names) + 3) + "|"]
    for dimension in DIMENSIONS:
        cells = []
        for run in runs:
            judged = run.judge.get("scores", {}).get(dimension) if run.judge else None
            cells.append(judge_cell(run.judge, dimension) if judged else "not judged")
            cells.append(_number(result["scores"][dimension][run.name]))
        agreement = result["agreement"][dimension]
        lines.append(f"| {DIMENSION_LABELS[dimension]} | " + " | ".join(cells)
                     + f" | {result['rankings'][dimension]} | {_number(agreement['kendall_w'], 3)} |")
    models = sorted({f"`{run.judge['model']}`" for run in runs if run.judge and run.judge.get("model")})
    lines += ["", "Judge: the MLLM judge's score from each run's own evaluation (mean ± sd over its samples; "
              f"{', '.join(models) if models else 'no run was judged'}). Human: mean of {scores_text}, higher is "
              "better. Kendall's W: agreement of the raters who ranked the same game completely, averaged over "
              "such games (1 = identical rankings, 0 = none; - = no game ranked by two raters). The repository "
              "does not record the paper's Table 2 numbers (its judge is GPT-4V and its ranking study had 20 "
              "raters and four methods).", "",
              "## Raters", "", "| Rater | Complete rankings | Mean Spearman rho with the others | Pairs |",
              "|---|---|---|---|"]
    lines += [f"| {rater} | {row['rankings']} | {_number(row['spearman'], 3)} | {row['pairs']} |"
              for rater, row in result["raters"].items()]
    lines += ["", "Spearman rho between a rater's ranking and another rater's ranking of the same game in the same "
              "dimension (1 = same order, -1 = reversed), averaged over every such pair: a rater far below the "
              "others ranks differently from them."]
    return lines

