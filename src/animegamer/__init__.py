"""AnimeGamer training framework: data pipeline, three training phases, evaluation and game loop."""

__version__ = "0.1.0"
