"""``python -m animegamer.ranking``."""
from animegamer.ranking.cli import main

raise SystemExit(main())
