"""The known-answer learning benchmark: toy films whose states and motion levels are known, through the
whole recipe, scored beside its baselines (docs/known-answer.md). Run from the repository's root:

    python -m benchmarks.known_answer OUT [--size ci|gpu] [--seed N] [override ...]       # the benchmark
    python -m benchmarks.known_answer.data OUT [--size ci|gpu] [override ...]             # its data set only
    python -m benchmarks.known_answer.seeds OUT1 OUT2 ... --out DIR                       # several seeds summarised

- :mod:`.driver`: the benchmark (the command above);
- :mod:`.data`: the data set (films, pipeline, what is true about them);
- :mod:`.report`: its table, comparisons, curves and gallery;
- :mod:`.seeds`: several seeds' results summarised, each comparison against the seed spread;
- :mod:`.experiments`: its experiments (``configs/``), found through Hydra's search path;
- :mod:`.motion_probe`: synthetic moving latents and the small training loop of the motion-scope probe.
"""
