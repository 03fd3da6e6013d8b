"""Benchmarks of the framework, run from the repository's root (``python benchmarks/<name>.py``, or
``python -m benchmarks.<package>`` for a benchmark that is a package); nothing here is installed."""
