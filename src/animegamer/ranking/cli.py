"""``animegamer rank`` (or ``python -m animegamer.ranking``): serve the ranking page, or write its report from
the answers."""
from __future__ import annotations

import argparse
import logging
import math
from pathlib import Path
from typing import Optional, Sequence

from animegamer import ranking
from animegamer.errors import UserError, exit_on_user_error
from animegamer.ranking.app import RankingApp
from animegamer.ranking.runs import MAX_RUNS, MIN_RUNS, RUNS_HINT, common_games, load_runs
from animegamer.ranking.server import DEFAULT_PORT, HOST, REQUEST_TIMEOUT_S, RankingServer
from animegamer.utils.command import program_name
from animegamer.utils.io import out_dir_problem
from animegamer.utils.logging import setup_logging

log = logging.getLogger(__name__)

MAX_PORT = 65535


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=program_name("animegamer.ranking"),
                                     description=ranking.__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", nargs="+", required=True,
                        help=f"{MIN_RUNS} to {MAX_RUNS} {RUNS_HINT}")
    parser.add_argument("--names", nargs="+", help="a name per run for the report (default: the folder names)")
    parser.add_argument("--out", required=True, type=Path, help="folder of the answers and the report")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT,
                        help=f"port on {HOST}, 0 to {MAX_PORT} (0: any free port)")
    parser.add_argument("--request-timeout", type=float, default=REQUEST_TIMEOUT_S, metavar="SECONDS",
                        help="drop a request that stalls this long (default %(default)s)")
    parser.add_argument("--report-only", action="store_true", help="write the report from the answers and exit")
    return parser


def option_problems(args: argparse.Namespace) -> list[str]:
    """What is wrong with the options no file is needed to check, each naming its option (and the key of
    ``animegamer rank`` that sets it)."""
    problems = []
    problem = out_dir_problem(args.out)
    if problem:
        problems.append(f"--out {args.out}: {problem}; choose another folder for the answers and the report")
    if not args.report_only:  # the report alone serves nothing: the server's options are not used
        if not 0 <= args.port <= MAX_PORT:
            problems.append(f"--port {args.port} (ranking.port): a port is 0 to {MAX_PORT} (0: any free port)")
        # math.isfinite: a socket takes no infinite timeout
        if not (args.request_timeout > 0 and math.isfinite(args.request_timeout)):
            problems.append(f"--request-timeout {args.request_timeout:g} (ranking.request_timeout_s): a finite "
                            "number of seconds > 0")
    return problems


def bind(port: int, timeout_s: float) -> RankingServer:
    """The server bound to its port, with no app yet: a port that is taken is refused before the ``--out``
    folder gets a session record or a report."""
    try:
        return RankingServer(None, port, timeout_s)
    except OSError as error:
        raise UserError(f"--port {port} (ranking.port): cannot serve on {HOST}:{port} ({error}); pass another "
                        "--port (0: any free port)") from error


@exit_on_user_error
def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging("INFO")
    problems = option_problems(args)
    if problems:
        raise UserError("; ".join(problems) if len(problems) == 1
                        else f"{len(problems)} problems:\n" + "\n".join(f"  - {p}" for p in problems))
    runs = load_runs(args.runs, args.names)
    games = common_games(runs)  # runs of other games are refused before the port is taken
    server = None if args.report_only else bind(args.port, args.request_timeout)
    try:
        app = RankingApp(runs, args.out, games)
        app.write_report()
        report = app.report_files()["report_md"]
        if server is None:
            log.info("ranking: %d answers; report %s", app.store.lines, report)
            return 0
        server.app = app
        log.info("ranking: raters open %s?rater=THEIR_NAME in a browser on this machine; every answer is saved to "
                 "%s as it is given; the scores are in %s (rewritten after every answer, never shown to the "
                 "raters); Ctrl-C to stop", server.url, app.store.path, report)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            log.info("ranking: stopped; report %s", report)
        return 0
    finally:
        if server is not None:
            server.server_close()
