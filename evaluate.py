"""Evaluate a trained game: ``python evaluate.py experiment=quickstart_eval``, the same as
``animegamer eval ...`` (:mod:`animegamer.cli.evaluate`)."""
from animegamer.cli.evaluate import main

if __name__ == "__main__":
    main()
