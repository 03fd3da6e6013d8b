"""``python -m benchmarks.known_answer``: the benchmark (:func:`benchmarks.known_answer.driver.main`)."""
from benchmarks.known_answer.driver import main

raise SystemExit(main())
