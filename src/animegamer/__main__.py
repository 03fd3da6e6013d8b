"""``python -m animegamer <verb> [key=value ...]``: the ``animegamer`` command (:mod:`animegamer.cli`)."""
from animegamer.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
