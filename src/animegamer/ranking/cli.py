"""``python -m animegamer.ranking``: serve the ranking page, or write its report from the answers."""
from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Optional, Sequence

from animegamer import ranking
from animegamer.errors import UserError, exit_on_user_error
from animegamer.ranking.app import RankingApp
from animegamer.ranking.runs import MAX_RUNS, MIN_RUNS, load_runs
from animegamer.ranking.server import DEFAULT_PORT, HOST, REQUEST_TIMEOUT_S, RankingServer
from animegamer.utils.io import out_dir_problem
from animegamer.utils.logging import setup_logging

log = logging.getLogger(__name__)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m animegamer.ranking", description=ranking.__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", nargs="+", required=True, help=f"{MIN_RUNS} to {MAX_RUNS} evaluate.py output folders")
    parser.add_argument("--names", nargs="+", help="a name per run for the report (default: the folder names)")
    parser.add_argument("--out", required=True, type=Path, help="folder of the answers and the report")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port on {HOST} (0: any free port)")
    parser.add_argument("--request-timeout", type=float, default=REQUEST_TIMEOUT_S, metavar="SECONDS",
                        help="drop a request that stalls this long (default %(default)s)")
    parser.add_argument("--report-only", action="store_true", help="write the report from the answers and exit")
    return parser


@exit_on_user_error
def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging("INFO")
    problem = out_dir_problem(args.out)
    if problem:
        raise UserError(f"--out {args.out}: {problem}; choose another folder for the answers and the report")
    app = RankingApp(load_runs(args.runs, args.names), args.out)
    app.write_report()
    report = app.report_files()["report_md"]
    if args.report_only:
        log.info("ranking: %d answers; report %s", app.store.lines, report)
        return 0
    try:
        server = RankingServer(app, args.port, args.request_timeout)
    except OSError as error:
        raise UserError(f"cannot serve on {HOST}:{args.port} ({error}); pass another --port") from error
    log.info("ranking: raters open %s?rater=THEIR_NAME in a browser on this machine; every answer is saved to %s "
             "as it is given; the scores are in %s (rewritten after every answer, never shown to the raters); "
             "Ctrl-C to stop", server.url, app.store.path, report)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        log.info("ranking: stopped; report %s", report)
    finally:
        server.server_close()
    return 0
