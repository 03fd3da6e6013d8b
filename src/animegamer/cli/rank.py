"""Rank evaluated runs blind: ``animegamer rank ranking.runs=[RUN_A,RUN_B] ranking.out=DIR [key=value ...]``.

The keys are the rank root's (``configs/rank.yaml``: ``ranking.*``); the options of ``python -m
animegamer.ranking`` (``--runs A B --out DIR --port N --request-timeout S --report-only``) are taken too and
win over the keys they set. Serves the ranking page, or writes its report from the answers.
"""
from __future__ import annotations

import sys
from typing import Optional, Sequence

from omegaconf import OmegaConf

from animegamer.config.compose import compose_config
from animegamer.config.schema import RankingConfig
from animegamer.errors import exit_on_user_error
from animegamer.ranking import cli as ranking_cli

ROOT = "rank"


def is_override(argument: str) -> bool:
    """``key=value`` (an override), as against an option or an option's value."""
    return not argument.startswith("-") and "=" in argument.split("/", 1)[0]


def options_of(ranking: RankingConfig) -> list[str]:
    """The ranking command's options that give ``ranking``'s values (those left empty: none)."""
    options = ["--port", str(ranking.port), "--request-timeout", str(ranking.request_timeout_s)]
    options += ["--runs", *ranking.runs] if ranking.runs else []
    options += ["--names", *ranking.names] if ranking.names else []
    options += ["--out", ranking.out] if ranking.out else []
    return options + (["--report-only"] if ranking.report_only else [])


@exit_on_user_error
def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in argv):  # the keys with their defaults, then the options that set them
        keys = OmegaConf.to_yaml(compose_config(ROOT))
        options = ranking_cli.build_parser().format_help()
        sys.stdout.write(f"{__doc__.replace('``', '')}\nKeys (key=value):\n{keys}\n{options}")
        return 0
    ranking = OmegaConf.to_object(compose_config(ROOT, [a for a in argv if is_override(a)])).ranking
    return ranking_cli.main([*options_of(ranking), *(a for a in argv if not is_override(a))])


if __name__ == "__main__":  # python -m, as the animegamer command makes its verb look to a process it restarts
    sys.exit(main())
