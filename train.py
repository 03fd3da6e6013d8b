"""Train one phase: ``python train.py experiment=quickstart_a``, the same as ``animegamer train ...``
(:mod:`animegamer.cli.train`)."""
from animegamer.cli.train import main

if __name__ == "__main__":
    main()
