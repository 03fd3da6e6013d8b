"""Evaluation: the held-out games played and scored (``runner``, ``evaluate.py``'s body, on the games of
``benchmark``), an unchanged evaluation read back instead of played again (``reuse``, through the folder's
``record``), metrics.json / report.md / gallery.html (``report``, drawn with ``drawing``), the
vision-language judge (``judge``, also ``python -m animegamer.evaluation.judge``; its record and Table 2 in
``judge_record``), the counterfactual motion sweep (``motion_sweep``) and the evaluation's pre-flight
(``preflight``).

These modules play the game and draw pages, so they sit above the metric computations
(:mod:`animegamer.metrics`), which they use. Importing this package imports none of them; the report, the
judge and what they import load neither torch nor OpenCV (the ranking page and ``animegamer --help`` import
them), while the runner loads the models.
"""
