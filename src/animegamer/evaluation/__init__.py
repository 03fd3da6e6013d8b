"""Evaluation: the held-out games played and scored (``runner``, ``evaluate.py``'s body), an unchanged
evaluation read back instead of played again (``reuse``), metrics.json / report.md / gallery.html
(``report``), the vision-language judge (``judge``, also ``python -m animegamer.evaluation.judge``), the
counterfactual motion sweep (``motion_sweep``) and the evaluation's pre-flight (``preflight``).

These modules play the game and draw pages, so they sit above the metric computations
(:mod:`animegamer.metrics`), which they use. Importing this package imports none of them.
"""
