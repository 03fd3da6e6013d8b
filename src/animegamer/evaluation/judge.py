"""The MLLM judge of the paper's Table 2: each played game scored from 1 to 10 in six dimensions.

The paper asks GPT-4V; here any OpenAI-compatible chat endpoint with image input does (a hosted model,
or a local server such as vLLM serving an open VLM), through ``animegamer.utils.http``'s client and
retry rules (the pipeline's ``http`` captioner uses the same). One request per sample holds the whole
game: for every turn its instruction, the motion level and state changes the game predicted, and
``frames_per_turn`` evenly spaced frames of its clip; the prompt (``templates/judge_prompt.txt.j2``,
ours: the paper's is not public) asks for one JSON object with the six integer scores. An answer is
parsed strictly (exactly the six keys, integers within 1..10); an unusable one is asked again with
the reason, a failed request (timeout, 429, 5xx) is sent again after a back-off, and a sample still
without a valid answer is unavailable, never guessed. Each game is judged ``samples`` times: its
score is the mean of its valid samples and their standard deviation is its spread. Without an
endpoint every score is unavailable, as the model-based metrics of Table 1 are without weights.

Each request has a deadline (``deadline_s``) and the run a budget (``budget_s``): once it is spent the
games left are not judged, and the record says so. A game whose clip is missing or cannot be decoded
is not judged (its turn numbers and state history would be wrong): it is reported unscored with the
reason, and the other games are judged.
"""
from __future__ import annotations

import functools
import hashlib
import json
import logging
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence

import jinja2
import numpy as np
from omegaconf import OmegaConf
from PIL import Image

from animegamer.config.compose import compose_config
from animegamer.config.validate import ConfigError, positive
from animegamer.contracts.states import CHARACTER_STATES, MOTION_LEVEL
from animegamer.errors import UserError, exit_on_user_error
from animegamer.evaluation.judge_record import DIMENSIONS, SCORE_RANGE, SETTINGS, game_reason
from animegamer.evaluation.report import VIDEO_KEYS, read_evaluation, write_report
from animegamer.game.state import INITIAL_STATE, update_states
from animegamer.media.video import decode_mp4, pick_frames
from animegamer.metrics.common import available, unavailable
from animegamer.pages import TEMPLATE_FOLDER, TEMPLATE_PACKAGE
from animegamer.utils.http import (ERROR_DETAIL_CHARS, IMAGE, RETRY_BACKOFF_S, TEXT, ContentPart, OpenAIChatClient,
                                   answer_with_retries, api_key_from_env, client_setting_problems, redact)
from animegamer.utils.command import program_name
from animegamer.utils.logging import setup_logging

log = logging.getLogger("animegamer.evaluation.judge")  # the same name under ``python -m``

JUDGE_PROMPT_VERSION = "1"  # raise with every change of the prompt's text
PROMPT_TEMPLATE = "judge_prompt.txt.j2"
PROMPT_SHA_CHARS = 12
NO_ENDPOINT = "no judge endpoint: set evaluation.judge.url and evaluation.judge.model_name"
# What ``animegamer judge`` takes, as users make it (evaluate.py at the repository's root runs the same command).
FOLDER_HINT = "pass a folder written by animegamer eval or evaluate.py (its evaluation.out)"
LABEL = "judge"  # how the retry loop's log lines name this client
_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)


# --------------------------------------------------------------------------- the game as the judge sees it
@dataclass(frozen=True)
class JudgedTurn:
    instruction: str
    frames: np.ndarray  # (T, H, W, 3) uint8: the clip the game generated
    predicted: Mapping[str, int]  # ML, SC, ET, ST as the game generated them


@dataclass(frozen=True)
class JudgedGame:
    id: str
    turns: tuple[JudgedTurn, ...]
    problem: str = ""  # why the game cannot be judged (a missing or unreadable clip): reported, never asked


def _signed(delta: int) -> str:
    return f"{delta:+d}" if delta else "0"


def state_changes(turns: Sequence[Mapping[str, int]]) -> list[str]:
    """Per turn: "SC +1 (50 -> 55), ET 0 (50 -> 50), ST -1 (50 -> 45)", by the game's own state rule."""
    states = {key: INITIAL_STATE for key in CHARACTER_STATES}
    texts = []
    for predicted in turns:
        after = update_states(states, predicted)
        texts.append(", ".join(f"{key} {_signed(int(predicted[key]))} ({states[key]} -> {after[key]})"
                               for key in CHARACTER_STATES))
        states = after
    return texts


def _frame_images(frames: np.ndarray, count: int, max_side: int) -> list:
    images = []
    for frame in pick_frames(frames, count):
        image = Image.fromarray(frame)
        image.thumbnail((max_side, max_side), Image.Resampling.LANCZOS)  # keeps the aspect, never enlarges
        images.append(image)
    return images


# --------------------------------------------------------------------------- the prompt
@functools.lru_cache(maxsize=1)
def _prompt_environment():
    """The package's templates rendered as plain text (no HTML escaping of instructions)."""
    return jinja2.Environment(loader=jinja2.PackageLoader(TEMPLATE_PACKAGE, TEMPLATE_FOLDER), autoescape=False,
                              undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)


def prompt_macros():
    """The prompt file's macros: ``intro``, ``turn``, ``rubric``, ``feedback``."""
    return _prompt_environment().get_template(PROMPT_TEMPLATE).module


def prompt_sha256() -> str:
    """The prompt file's content hash: an edited prompt shows in the report even without a new version."""
    env = _prompt_environment()
    source = env.loader.get_source(env, PROMPT_TEMPLATE)[0]
    return hashlib.sha256(source.encode("utf-8")).hexdigest()[:PROMPT_SHA_CHARS]


def request_parts(game: JudgedGame, frames_per_turn: int, image_max_side: int,
                  feedback: Optional[str] = None) -> list[ContentPart]:
    """One request: the intro, every turn's text followed by its frames, the rubric (+ the last error)."""
    macros = prompt_macros()
    parts: list[ContentPart] = [(TEXT, str(macros.intro(len(game.turns), frames_per_turn)))]
    changes = state_changes([turn.predicted for turn in game.turns])
    for number, (turn, change) in enumerate(zip(game.turns, changes), start=1):
        parts.append((TEXT, str(macros.turn(number, turn.instruction, int(turn.predicted[MOTION_LEVEL]), change))))
        parts += [(IMAGE, image) for image in _frame_images(turn.frames, frames_per_turn, image_max_side)]
    rubric = str(macros.rubric(list(DIMENSIONS), *SCORE_RANGE))
    parts.append((TEXT, rubric + (f"\n\n{macros.feedback(feedback)}" if feedback is not None else "")))
    return parts


# --------------------------------------------------------------------------- the answer
def parse_scores(text: str) -> dict[str, int]:
    """Exactly one JSON object (optionally in a ```json fence) with the six dimensions as integers in
    1..10; anything else raises ``ValueError`` with a message fit to be shown back to the judge."""
    body = text.strip()
    fenced = _FENCE.match(body)
    if fenced:
        body = fenced.group(1)
    try:
        data = json.loads(body)
    except json.JSONDecodeError as exc:
        raise ValueError(f"the answer is not a single JSON object ({exc.msg} at char {exc.pos})") from exc
    if not isinstance(data, dict):
        raise ValueError(f"the answer must be a JSON object, got {type(data).__name__}")
    missing = [key for key in DIMENSIONS if key not in data]
    unknown = sorted(key for key in data if key not in DIMENSIONS)
    if missing or unknown:
        raise ValueError(f"the object must have exactly the keys {list(DIMENSIONS)}"
                         + (f"; missing {missing}" if missing else "") + (f"; unknown {unknown}" if unknown else ""))
    low, high = SCORE_RANGE
    for key in DIMENSIONS:
        value = data[key]
        # bool is an int subclass, and 7.5 or "7" are not the integers asked for
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ValueError(f'"{key}" must be an integer from {low} to {high}, got {value!r}')
    return {key: data[key] for key in DIMENSIONS}


# --------------------------------------------------------------------------- scoring
def _settings(cfg) -> dict:
    return {"model": cfg.model_name or None, "endpoint": redact(cfg.url) if cfg.url else None,
            "prompt_version": JUDGE_PROMPT_VERSION, "prompt_sha256": prompt_sha256(),
            "samples_per_game": cfg.samples, "frames_per_turn": cfg.frames_per_turn,
            "temperature": cfg.temperature, "score_range": list(SCORE_RANGE), "deadline_s": cfg.deadline_s,
            "budget_s": cfg.budget_s}


def unavailable_record(cfg, reason: str, games: int = 0) -> dict:
    """Every dimension unavailable with ``reason`` (no endpoint, or no game to judge)."""
    return {**_settings(cfg), "games": games, "games_scored": 0, "reason": reason,
            "scores": {key: unavailable(reason) for key in DIMENSIONS}, "spread": {key: None for key in DIMENSIONS},
            "per_game": [], "budget_exhausted": False}


def _sd(values: Sequence[float]) -> Optional[float]:
    """Sample standard deviation; None below two values (one sample says nothing about the spread)."""
    return statistics.stdev(values) if len(values) >= 2 else None


def game_summary(game_id: str, samples: Sequence[dict], problem: str = "") -> dict:
    """Mean and standard deviation of a game's valid samples, per dimension (None when none is valid);
    ``reason``: why the game is unscored (``problem``, else its last sample's error), "" when scored."""
    valid = [s["scores"] for s in samples if s["scores"] is not None]
    mean = {key: statistics.mean(v[key] for v in valid) for key in DIMENSIONS} if valid else None
    sd = {key: _sd([v[key] for v in valid]) for key in DIMENSIONS} if valid else None
    reason = "" if mean is not None else problem or (samples[-1]["error"] if samples else "no sample asked")
    return {"id": game_id, "samples": list(samples), "valid_samples": len(valid), "mean": mean, "sd": sd,
            "reason": reason}


def summarize(cfg, per_game: Sequence[dict], budget_exhausted: bool = False) -> dict:
    """Table 2's judge column: per dimension the mean over scored games of each game's mean, and the
    spread as the mean over games of each game's sample standard deviation (the judge's own noise)."""
    scored = [g for g in per_game if g["mean"] is not None]
    if not scored:
        reason = "no game scored" + (f": {game_reason(per_game[-1])}" if per_game else "")
        return {**unavailable_record(cfg, reason, len(per_game)), "per_game": list(per_game),
                "budget_exhausted": budget_exhausted}
    scores, spread = {}, {}
    for key in DIMENSIONS:
        scores[key] = available(statistics.mean(g["mean"][key] for g in scored))
        sds = [g["sd"][key] for g in scored if g["sd"][key] is not None]
        spread[key] = statistics.mean(sds) if sds else None
    return {**_settings(cfg), "games": len(per_game), "games_scored": len(scored), "scores": scores,
            "spread": spread, "per_game": list(per_game), "budget_exhausted": budget_exhausted}


class Judge:
    """Scores games through ``cfg`` (an ``evaluation.judge`` node) with an OpenAI-compatible endpoint."""

    def __init__(self, cfg, backoff_s: float = RETRY_BACKOFF_S) -> None:
        self.cfg = cfg
        self.backoff_s = backoff_s
        self.client = OpenAIChatClient(cfg.url, cfg.model_name, cfg.timeout_s, api_key_from_env(cfg.api_key_env, LABEL),
                                       deadline_s=cfg.deadline_s, budget_s=cfg.budget_s or None, settings=SETTINGS)

    def sample(self, game: JudgedGame) -> dict:
        """One judgement of ``game``: ``{"scores": {...} or None, "attempts": n, "error": ""}``."""
        cfg = self.cfg
        ask: Callable[[Optional[str]], str] = lambda feedback: self.client.complete(
            request_parts(game, cfg.frames_per_turn, cfg.image_max_side, feedback), cfg.max_tokens, cfg.temperature)
        outcome = answer_with_retries(ask, parse_scores, cfg.retries, f"{LABEL} {game.id}", self.backoff_s)
        if not outcome.ok:
            log.warning("judge: game %s: a sample is unavailable: %s", game.id, outcome.error)
        return {"scores": outcome.value, "attempts": outcome.attempts, "error": outcome.error}

    def score(self, games: Sequence[JudgedGame]) -> dict:
        per_game = []
        for game in games:
            if game.problem:
                log.warning("judge: game %s is not judged: %s", game.id, game.problem)
                per_game.append(game_summary(game.id, [], game.problem))
                continue
            samples = [self.sample(game) for _ in range(self.cfg.samples)]
            per_game.append(game_summary(game.id, samples))
            mean = per_game[-1]["mean"]
            log.info("judge: game %s: %d/%d valid samples%s", game.id, per_game[-1]["valid_samples"],
                     len(samples), f", overall {mean['overall']:.2f}" if mean else "")
        return summarize(self.cfg, per_game, self.client.budget_exhausted)


def judge_games(cfg, games: Sequence[JudgedGame], backoff_s: float = RETRY_BACKOFF_S) -> dict:
    """The judge's record for ``games`` (what metrics.json keeps under ``judge``)."""
    if not cfg.url:
        return unavailable_record(cfg, NO_ENDPOINT, len(games))
    if not games:
        return unavailable_record(cfg, "no game was played")
    return Judge(cfg, backoff_s).score(games)


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return (lines[0] if lines else type(error).__name__)[:ERROR_DETAIL_CHARS]


def _clip_frames(turn: Mapping, number: int) -> tuple[Optional[np.ndarray], str]:
    """A played turn's clip decoded, or None and why it cannot be judged."""
    if not turn.get("video"):
        return None, f"turn {number} has no clip recorded"
    path = Path(turn["video"])
    if not path.is_file():
        return None, f"turn {number}: clip {path} is missing"
    try:
        frames = decode_mp4(path.read_bytes())
    except Exception as error:  # noqa: BLE001 - decord raises its own error type or RuntimeError by failure
        return None, f"turn {number}: clip {path} cannot be decoded ({_first_line(error)})"
    if len(frames) == 0:
        return None, f"turn {number}: clip {path} has no frames"
    return frames, ""


def games_from_report(games: Sequence[Mapping]) -> list[JudgedGame]:
    """Evaluation's report games (``evaluation.report``'s format: the turns played), their clips decoded.
    A game with a missing or unreadable clip, or without a played turn, comes back with its ``problem``
    and no turn: judging the turns left would show the judge wrong turn numbers and state history."""
    judged = []
    for game in games:
        turns, problem = [], ""
        for number, turn in enumerate(game.get("turns", []), start=1):
            frames, problem = _clip_frames(turn, number)
            if frames is None:
                break
            turns.append(JudgedTurn(str(turn["instruction"]), frames, dict(turn["states"])))
        if not game.get("turns"):
            problem = "no turn was played" + (f" (the game stopped: {game['stopped']})" if game.get("stopped") else "")
        judged.append(JudgedGame(str(game["id"]), () if problem else tuple(turns), problem))
    return judged


def judge_report_games(cfg, games: Sequence[Mapping], backoff_s: float = RETRY_BACKOFF_S) -> dict:
    """What ``evaluate.py`` calls: the played games judged, or every score unavailable without an endpoint
    (then no clip is decoded)."""
    if not cfg.url:
        return unavailable_record(cfg, NO_ENDPOINT, len(games))
    return judge_games(cfg, games_from_report(games), backoff_s)


# --------------------------------------------------------------------------- judging a finished evaluation
def judge_folder(folder: str | Path, cfg, backoff_s: float = RETRY_BACKOFF_S) -> dict:
    """Judge the games of an ``evaluate.py`` folder again (another judge, more samples) without playing
    them: ``metrics.json``'s judge record and ``report.md`` are rewritten from the clips in the folder."""
    folder = Path(folder)
    record = read_evaluation(folder, FOLDER_HINT, ("metrics", "games"))
    metrics, games = record["metrics"], record["games"]
    # metrics.json keeps clip paths relative to its folder; write_report reads them as this process sees them
    games = [{**game, "turns": [{**turn, **{key: str(folder / turn[key]) for key in VIDEO_KEYS if turn.get(key)}}
                                for turn in game.get("turns", [])]} for game in games]
    judged = judge_report_games(cfg, games, backoff_s)
    if not judged["games_scored"]:
        # A judge that scored nothing (its endpoint down, say) says nothing about the games: whatever the folder
        # holds (an earlier judge's scores, or none) stays as it was, and the command fails with the reason.
        earlier = metrics.get("judge") or {}
        kept = (f"the earlier judge record ({earlier['games_scored']} of {earlier.get('games')} games scored) is "
                "kept, " if earlier.get("games_scored") else "")
        raise JudgeFailed(f"{folder}: the judge scored no game ({judged.get('reason', 'no answer')}); {kept}"
                          "metrics.json and report.md unchanged: fix that (an endpoint that did not answer: check "
                          "evaluation.judge.url and evaluation.judge.model_name) and judge again")
    metrics["judge"] = judged
    write_report(folder, metrics, games, paper=record.get("paper") or {})
    return metrics["judge"]


class JudgeFailed(UserError):
    """Judging a folder scored no game: its files are left as they were."""


JUDGE_TEMPERATURE_RANGE = (0.0, 2.0)  # what OpenAI-compatible servers accept


def check_judge(judge) -> list[str]:
    """``evaluation.judge``: an http(s) endpoint with a model name, or no endpoint (scores unavailable)."""
    key = SETTINGS
    problems = []
    if judge.url and not judge.url.startswith(("http://", "https://")):
        problems.append(f"{key}.url={redact(judge.url)!r}: must be an http(s) base URL such as "
                        "http://127.0.0.1:8000/v1 (or '' for no judge)")
    if judge.url and not judge.model_name:
        problems.append(f"{key}.model_name is empty: name the model the endpoint at {redact(judge.url)} serves")
    problems += client_setting_problems(key, judge)
    problems += positive(key, judge, ("samples", "frames_per_turn", "image_max_side", "max_tokens"))
    if judge.retries < 0:
        problems.append(f"{key}.retries={judge.retries} must be >= 0")
    low, high = JUDGE_TEMPERATURE_RANGE
    if not low <= judge.temperature <= high:
        problems.append(f"{key}.temperature={judge.temperature} must be in [{low}, {high}]")
    return problems


HELP_OPTIONS = ("-h", "--help")
JUDGE_USAGE = ("{prog} EVAL_FOLDER evaluation.judge.url=URL evaluation.judge.model_name=NAME "
               "[evaluation.judge.*=...]")
JUDGE_HELP = """usage: {usage}

Judge the games of a finished evaluation again (another judge, more samples) without playing them: each
game is scored from 1 to 10 in six dimensions (the paper's Table 2) by an OpenAI-compatible chat endpoint
with image input, and EVAL_FOLDER's metrics.json (its judge record) and report.md are rewritten.

  EVAL_FOLDER  a folder written by `animegamer eval` (its evaluation.out)
  key=value    overrides of the evaluate root; evaluation.judge.url and evaluation.judge.model_name are
               needed; the API key is read from the environment variable evaluation.judge.api_key_env names

Keys (evaluation.judge.*, with their defaults):
{keys}"""


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``animegamer judge EVAL_FOLDER evaluation.judge.url=... [overrides]`` (or ``python -m
    animegamer.evaluation.judge``)."""
    def run() -> int:
        args = list(sys.argv[1:] if argv is None else argv)
        prog = program_name("animegamer.evaluation.judge")
        usage = JUDGE_USAGE.format(prog=prog)
        if any(a in HELP_OPTIONS for a in args):
            keys = OmegaConf.to_yaml(compose_config("evaluate").evaluation.judge)
            sys.stdout.write(JUDGE_HELP.format(usage=usage, keys=keys))
            return 0
        options = [a for a in args if a.startswith("-")]
        if options:  # the judge takes no option: a folder and key=value overrides
            raise UserError(f"{prog}: unknown option {options[0]!r}; usage: {usage} ({prog} --help says more)")
        if not args or "=" in args[0]:
            raise UserError(f"usage: {usage}")
        setup_logging("INFO")
        cfg = compose_config("evaluate", args[1:]).evaluation.judge
        problems = check_judge(cfg)
        if not cfg.url:  # check_judge allows no endpoint (evaluation without a judge); judging needs one
            problems.append("evaluation.judge.url is empty: name the judge's endpoint")
            if not cfg.model_name:
                problems.append("evaluation.judge.model_name is empty: name the model the endpoint serves")
        try:  # the folder too, so that one run names every problem
            read_evaluation(args[0], FOLDER_HINT, ("metrics", "games"))
        except UserError as error:
            problems.append(str(error))
        if problems:
            raise ConfigError(problems)
        record = judge_folder(args[0], cfg)
        log.info("judge: %d of %d games scored; report %s", record["games_scored"], record["games"],
                 Path(args[0]) / "report.md")
        return 0

    return exit_on_user_error(run)()


if __name__ == "__main__":
    raise SystemExit(main())
