"""``python -m animegamer.game``."""
import sys

from animegamer.game.cli import main

sys.exit(main())
