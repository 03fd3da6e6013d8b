"""Human ranking of evaluated runs, the paper's Table 2 user study: a local page, its answers, their scores.

    python -m animegamer.ranking --runs outputs/eval_c outputs/eval_a --names adapted plain --out rankings

serves a page on 127.0.0.1 (standard library ``http.server``; no outside network) that shows the same
benchmark game from 2 to 4 ``evaluate.py`` folders side by side (each turn's clip, instruction and
predicted states) and asks the rater to rank the clips in each of the six dimensions of the MLLM judge.
The runs are shown blind, as columns A, B, ... in an order drawn per rater and game from a secret of the
``--out`` folder: the page, the clips' addresses and the replies name columns only, the server resolves
each column to its run, and the scores are never served (they are in the report, for whoever runs the
server). Every choice is stored the moment it is made: one line appended to ``<out>/answers.jsonl`` and
fsynced before the page is told it is saved, so a crash or a closed tab loses nothing and a reload shows
the rater's answers again. Each complete ranking (every column ranked, no rank twice) scores the runs
with the paper's mapping of ranks 1..4 to 10/7/4/1; ``<out>/report.md`` and ``rankings.json`` give, per
dimension and run, the mean score beside the run's MLLM judge score, with the raters' agreement:
Kendall's W per dimension and, per rater, the mean Spearman correlation with every other rater. They are
rewritten after every answer, from every answer in the folder (several servers may share it);
``--report-only`` writes them from the answers without serving.

Modules: ``runs`` (the evaluation folders, the blind column order), ``store`` (the answers file and the
folder's lock), ``scores`` (scores, agreement, report.md), ``app`` (pages, clips, answers and tokens of
one folder), ``server`` (HTTP, and what it refuses), ``cli`` (the command line).
"""
from animegamer.ranking.app import RankingApp
from animegamer.ranking.runs import Run, column_order, common_games, load_run, load_runs
from animegamer.ranking.scores import aggregate, kendall_w, report_lines, spearman
from animegamer.ranking.server import RankingServer
from animegamer.ranking.store import AnswerStore

__all__ = ["AnswerStore", "RankingApp", "RankingServer", "Run", "aggregate", "column_order", "common_games",
           "kendall_w", "load_run", "load_runs", "report_lines", "spearman"]
