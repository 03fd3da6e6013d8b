"""The playable game loop: instruction in, clip and character states out.

Per turn:

1. the game-state MLLM reads the sliding window of past turns (at most ``window_turns - 1`` of them, each
   with its instruction, its predicted states and its predicted representation) and the new
   instruction, and predicts the turn's states (ML, SC, ET, ST) and representation (N, D);
2. the motion level ML becomes a motion-scope flow value through the clip manifest's
   ``motion_bins.level_flow`` (the flow the training data's clips of that level had);
3. the decoder samples the clip's latents from the representation (DPM++, dynamic CFG; the
   unconditional branch is the encoder on zero text and image features), seeded by (seed, turn);
4. the VAE decodes them into frames;
5. the character states move: ``value = clamp(value + 5 * delta, 0, 100)`` for SC, ET and ST, starting
   at 50 (the official demo).

A malformed state generation is an error (``ValueError`` naming the turn), never default states.

Command line::

    python -m animegamer.game --mllm EXPORT --renderer EXPORT [--renderer EXPORT] --clips-manifest MANIFEST \\
        --instructions FILE.txt --out DIR [hydra overrides ...]
    python -m animegamer.game ... --interactive --out DIR      # instructions from stdin, one per line
    python -m animegamer.game ... --max-turns 3 --window-turns 2   # play 3 turns; the MLLM sees 1 past turn

``--max-turns`` limits the turns played (default: every instruction); ``--window-turns`` is the MLLM's
window, the new turn included (default K). A wrong path or override exits with code 2 and a message.

The output folder holds ``turn_000.mp4``, ``turn_001.mp4``, ..., ``game.json`` (the full log) and
``index.html`` (a storyboard), rewritten after every turn.
"""
from __future__ import annotations

import argparse
import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator, Mapping, Optional, Sequence

import numpy as np
import torch

from animegamer.config.schema import RunConfig
from animegamer.contracts.files import MANIFEST
from animegamer.contracts.states import CHARACTER_STATES, ENTERTAINMENT, MOTION_LEVEL, SOCIAL, STAMINA
from animegamer.errors import OutputExistsError, UserError, exit_on_user_error
from animegamer.game_models import GameModels, load_game_models, read_level_flow
from animegamer.mllm.predict import HistoryTurn, Prediction, window
from animegamer.mllm.sequence import Turn
from animegamer.pages import POSTER_SUFFIX, poster_path, save_poster
from animegamer.utils.randomness import step_seed

log = logging.getLogger("animegamer.game")  # the same name under ``python -m animegamer.game``

__all__ = [
    "CHARACTER_STATES", "INITIAL_STATE", "STATE_STEP", "STATE_RANGE", "TurnResult", "Game", "GameWriter",
    "PlayedGame", "play_game", "play_games", "play_turns", "update_states", "read_instructions", "window", "main",
]

INITIAL_STATE = 50  # official demo
STATE_STEP = 5  # one unit of predicted delta moves a bar by 5
STATE_RANGE = (0, 100)
GAME_FILE = "game.json"
INDEX_FILE = "index.html"
GAME_FORMAT_VERSION = 2  # 2: "window_turns" (was "max_turns"), a poster (turn_NNN.jpg) beside each clip

# predict_fn(model, tokenizer, ids, history, instruction, window_turns) -> Prediction (predict_next's signature)
PredictFn = Callable[..., Prediction]


def clip_name(index: int) -> str:
    return f"turn_{index:03d}.mp4"


# --------------------------------------------------------------------------- states
def update_states(states: Mapping[str, int], predicted: Mapping[str, int]) -> dict[str, int]:
    """``clamp(value + 5 * delta, 0, 100)`` for SC, ET and ST (the official demo's rule)."""
    low, high = STATE_RANGE
    return {k: max(low, min(high, int(states[k]) + STATE_STEP * int(predicted[k]))) for k in CHARACTER_STATES}


# --------------------------------------------------------------------------- one game
@dataclass
class TurnResult:
    index: int  # 0-based turn number
    instruction: str
    tokens: list[int]  # the generated state tokens
    token_text: Optional[str]  # their readable form
    predicted: dict[str, int]  # ML, SC, ET, ST as generated
    states_before: dict[str, int]  # SC, ET, ST
    states_after: dict[str, int]
    motion_level: int
    flow: float
    seed: int  # the turn's sampler seed
    frames: np.ndarray  # (T, H, W, 3) uint8
    rep: torch.Tensor  # (N, D) float32, CPU
    timings: dict[str, float]  # seconds: mllm, sample, vae_decode, total

    def to_record(self) -> dict:
        """What game.json keeps of the turn (no frames, no representation)."""
        return {"index": self.index, "instruction": self.instruction, "video": clip_name(self.index),
                "tokens": list(self.tokens), "token_text": self.token_text, "predicted": dict(self.predicted),
                "states_before": dict(self.states_before), "states_after": dict(self.states_after),
                "motion_level": self.motion_level, "flow": self.flow, "seed": self.seed,
                "frames": list(self.frames.shape), "timings": {k: round(v, 4) for k, v in self.timings.items()}}


class Game:
    """One play-through: character states, the history of turns and ``play_turn``.

    ``predict_fn`` has ``predict_next``'s signature and receives the window of past turns (never
    more than ``window_turns - 1``, oldest first); tests inject a stub. None (the default) is the MLLM
    of ``models`` itself, which :func:`play_turns` runs on several games in one batch. ``window_turns``
    defaults to K, the number of window lengths phase (b) trained on (``len(cfg.data.window_weights)``).
    """

    def __init__(self, models: GameModels, seed: int = 0, window_turns: Optional[int] = None,
                 predict_fn: Optional[PredictFn] = None, sampling_steps: int = 0) -> None:
        self.models = models
        self.cfg = models.cfg
        self.seed = int(seed)
        self.window_turns = int(window_turns if window_turns else len(self.cfg.data.window_weights))
        if self.window_turns < 1:
            raise ValueError(f"window_turns must be >= 1, got {self.window_turns}")
        self.predict_fn = predict_fn
        self.constrained = bool(models.cfg.model.mllm.constrained_states)
        self.diffusion = self.cfg.model.diffusion
        if sampling_steps:
            from dataclasses import replace

            self.diffusion = replace(self.diffusion, sampling_steps=int(sampling_steps))
        clips = self.cfg.pipeline.clips
        self.frames, self.height, self.width = clips.frames, clips.height, clips.width
        self.latent_shape = (1, *models.vae.latent_shape(clips.frames, clips.height, clips.width))
        self._uncond: Optional[torch.Tensor] = None
        self._states = {k: INITIAL_STATE for k in CHARACTER_STATES}
        self._history: list[HistoryTurn] = []
        self._results: list[TurnResult] = []

    # ---- read-only views
    @property
    def states(self) -> dict[str, int]:
        return dict(self._states)

    @property
    def history(self) -> tuple[HistoryTurn, ...]:
        """Every played turn, oldest first: (Turn(instruction, predicted states), predicted rep)."""
        return tuple(self._history)

    @property
    def results(self) -> tuple[TurnResult, ...]:
        return tuple(self._results)

    @property
    def turn_index(self) -> int:
        """The number of the next turn (0-based)."""
        return len(self._history)

    def turn_seed(self, index: int) -> int:
        return step_seed(self.seed, index, 0)

    # ---- one turn
    def _sync(self) -> None:
        if self.models.device.type == "cuda":
            torch.cuda.synchronize(self.models.device)

    def _unconditional(self) -> torch.Tensor:
        if self._uncond is None:
            self._uncond = self.models.renderer.encoder.unconditional()
        return self._uncond

    def flow_for(self, level: int) -> float:
        try:
            return self.models.level_flow[int(level)]
        except KeyError:
            raise ValueError(f"motion level {level} has no flow value in {self.models.level_flow}") from None

    @torch.no_grad()
    def play_turn(self, instruction: str) -> TurnResult:
        """Predict, render and apply one turn; the game is unchanged when it raises."""
        outcome = play_turns([self], [instruction])[0]
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    # ---- the pieces of a turn (play_turns runs them on a batch of games)
    def check_instruction(self, instruction: str) -> None:
        if not isinstance(instruction, str) or not instruction.strip():
            raise ValueError(f"turn {self.turn_index}: the instruction must be a non-empty string, got {instruction!r}")

    def turn_error(self, instruction: str, error: ValueError) -> ValueError:
        """A failed prediction, named by its turn (the game stays as it was)."""
        named = ValueError(f"turn {self.turn_index} ({instruction!r}): {error}")
        named.__cause__ = error
        return named

    def plan(self, instruction: str, prediction: Prediction) -> "TurnPlan":
        """The rendering inputs of the predicted turn: validated states, the level's flow, the seed."""
        predicted = {k: int(v) for k, v in prediction.states.items()}
        turn = Turn(instruction, predicted)  # validates keys and ranges
        flow = self.flow_for(turn.states[MOTION_LEVEL])
        return TurnPlan(self, self.turn_index, instruction, prediction, turn, flow,
                        prediction.rep.detach().float().cpu(), self.turn_seed(self.turn_index))

    def commit(self, plan: "TurnPlan", frames: np.ndarray, timings: dict[str, float]) -> TurnResult:
        """Apply a rendered turn: states move, the turn joins the history."""
        before = self.states
        after = update_states(before, plan.turn.states)
        level = plan.turn.states[MOTION_LEVEL]
        result = TurnResult(index=plan.index, instruction=plan.instruction,
                            tokens=[int(t) for t in plan.prediction.tokens],
                            token_text=_token_text(self.models.mllm, plan.prediction.tokens),
                            predicted=dict(plan.turn.states), states_before=before, states_after=after,
                            motion_level=level, flow=plan.flow, seed=plan.seed, frames=frames, rep=plan.rep,
                            timings=timings)
        self._states = after
        self._history.append(HistoryTurn(plan.turn, plan.rep))
        self._results.append(result)
        predicted = plan.turn.states
        log.info("turn %d: ML %d (flow %.3f) SC %+d ET %+d ST %+d -> %s in %.2fs", plan.index, level, plan.flow,
                 predicted[SOCIAL], predicted[ENTERTAINMENT], predicted[STAMINA], after, timings["total"])
        return result


@dataclass(frozen=True, eq=False)
class TurnPlan:
    """One game's turn between the MLLM step and rendering."""

    game: Game
    index: int
    instruction: str
    prediction: Prediction
    turn: Turn
    flow: float
    rep: torch.Tensor  # (N, D) float32, CPU
    seed: int


# --------------------------------------------------------------------------- one turn of several games
def _check_batchable(games: Sequence[Game]) -> None:
    """Games batched together share what one batch computes with: models, sampling and the window."""
    first = games[0]
    for game in games[1:]:
        if (game.models is not first.models or game.diffusion != first.diffusion
                or game.window_turns != first.window_turns or game.latent_shape != first.latent_shape
                or (game.predict_fn is None) != (first.predict_fn is None) or game.constrained != first.constrained):
            raise ValueError("games played in one batch must share models, sampling settings, window_turns and "
                             "the predictor")


def predict_turns(games: Sequence[Game], instructions: Sequence[str]) -> list[Prediction | ValueError]:
    """The MLLM step of one turn of each game: a prediction, or the ValueError naming that game's turn.

    Games on the built-in MLLM share one left-padded prefill and greedy loop; a game with its own
    ``predict_fn`` is asked alone. A prompt the batch cannot build or run (too long for the MLLM's
    window) is retried alone per game, so the error lands on the game it belongs to.
    """
    from animegamer.mllm.predict import generate_rows, prompts_batch
    from animegamer.mllm.sequence import parse_states

    outcomes: list[Prediction | ValueError] = []
    if games[0].predict_fn is not None:
        for game, instruction in zip(games, instructions):
            mllm = game.models.mllm
            try:
                past = window(game._history, game.window_turns)
                outcomes.append(game.predict_fn(mllm.model, mllm.tokenizer, mllm.ids, past, instruction,
                                                game.window_turns))
            except ValueError as error:
                outcomes.append(game.turn_error(instruction, error))
        return outcomes
    mllm, window_turns = games[0].models.mllm, games[0].window_turns
    try:
        batch = prompts_batch(mllm.model, mllm.tokenizer, mllm.ids, [g._history for g in games], instructions,
                              window_turns)
        rows = generate_rows(mllm.model, mllm.ids, batch, games[0].constrained)
    except ValueError as error:
        if len(games) == 1:
            return [games[0].turn_error(instructions[0], error)]
        return [outcome for game, instruction in zip(games, instructions)
                for outcome in predict_turns([game], [instruction])]
    for game, instruction, (tokens, rep) in zip(games, instructions, rows):
        try:
            outcomes.append(Prediction(parse_states(mllm.ids, tokens, mllm.tokenizer), rep, tokens))
        except ValueError as error:
            outcomes.append(game.turn_error(instruction, error))
    return outcomes


def render_latents(models: GameModels, diffusion, latent_shape: Sequence[int], plans: Sequence[TurnPlan],
                   uncond: torch.Tensor) -> torch.Tensor:
    """Decoder latents (B, T, C, H, W) of the planned turns, sampled in one batch (CFG doubles it).

    Each turn draws its noise from its own CPU generator seeded by (seed, turn): row b gets exactly
    the draws it would get sampled alone, on every device. With the step cache (``model.diffusion.cache``)
    a batch would decide together which steps to skip, so each turn is sampled alone instead: a game's
    clips never depend on which games share its batch."""
    from animegamer.diffusion.sampler import sample
    from animegamer.diffusion.step_cache import caching

    if caching(diffusion) and len(plans) > 1:
        return torch.cat([render_latents(models, diffusion, latent_shape, [plan], uncond) for plan in plans])
    device, dtype = models.device, models.dtype
    generators = [torch.Generator(device="cpu").manual_seed(plan.seed) for plan in plans]
    shape = (len(plans), *latent_shape[1:])
    reps = torch.stack([plan.rep for plan in plans]).to(device)
    flows = torch.tensor([plan.flow for plan in plans], device=device)
    return sample(models.denoiser, shape, reps, uncond, flows, diffusion, generators, dtype=dtype)


def decode_frames(vae, latents: torch.Tensor) -> np.ndarray:
    """(B, T, H, W, 3) uint8 clips of a batch of latents, decoded one clip at a time: on an H200 the
    paper VAE's decode time grows linearly with the batch (0.76 s for 1 clip, 2.36 s for 4), so batching
    gains nothing, while a batch of 8 clips at 480x720 failed inside a 3-D convolution; one at a time,
    a game's frames are also exactly what it decodes alone."""
    clips = []
    for one in latents.split(1):
        video = vae.decode(one)  # (1, T, H, W, 3) in [0, 1]
        clips.append((video.float().clamp(0, 1) * 255).round().to(torch.uint8).cpu())
    return torch.cat(clips).numpy()


@torch.no_grad()
def play_turns(games: Sequence[Game], instructions: Sequence[str]) -> list[TurnResult | ValueError]:
    """One turn of each game, the MLLM, the sampler and the VAE each run once on the batch.

    A game whose turn fails (empty instruction, malformed state generation) gets its ValueError in
    its place and stays unchanged; the others play on. Every game's result is what it would get
    played alone (its own history, seed and noise draws). A turn's timings are its share of each
    batched stage (the stage's seconds over the games in it), so they add up to the batch's time.
    """
    if len(games) != len(instructions) or not games:
        raise ValueError(f"{len(games)} games and {len(instructions)} instructions: need one instruction per game")
    _check_batchable(games)
    first = games[0]
    models, sync = first.models, first._sync
    start = time.perf_counter()
    outcomes: list[TurnPlan | ValueError | None] = [None] * len(games)
    asked = []
    for slot, (game, instruction) in enumerate(zip(games, instructions)):
        try:
            game.check_instruction(instruction)
            asked.append(slot)
        except ValueError as error:
            outcomes[slot] = error
    if asked:
        predictions = predict_turns([games[i] for i in asked], [instructions[i] for i in asked])
        for slot, prediction in zip(asked, predictions):
            if isinstance(prediction, ValueError):
                outcomes[slot] = prediction
                continue
            try:
                outcomes[slot] = games[slot].plan(instructions[slot], prediction)
            except ValueError as error:
                outcomes[slot] = games[slot].turn_error(instructions[slot], error)
    sync()
    mllm_s = time.perf_counter() - start
    slots = [slot for slot, outcome in enumerate(outcomes) if isinstance(outcome, TurnPlan)]
    plans = [outcomes[slot] for slot in slots]
    if not plans:
        return outcomes

    t0 = time.perf_counter()
    latents = render_latents(models, first.diffusion, first.latent_shape, plans, first._unconditional())
    sync()
    sample_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    clips = decode_frames(models.vae, latents)
    vae_s = time.perf_counter() - t0
    expected = (first.frames, first.height, first.width, 3)
    if clips.shape[1:] != expected:
        raise RuntimeError(f"turn {plans[0].index}: decoded clip {clips.shape[1:]}, expected {expected}")

    share = {"mllm": mllm_s / len(asked), "sample": sample_s / len(plans), "vae_decode": vae_s / len(plans)}
    for slot, plan, frames in zip(slots, plans, clips):
        outcomes[slot] = plan.game.commit(plan, frames, {**share, "total": sum(share.values())})
    return outcomes


def _token_text(mllm, tokens: Sequence[int]) -> Optional[str]:
    from animegamer.mllm.sequence import describe_ids
    from animegamer.mllm.tokens import TokenIds

    ids = getattr(mllm, "ids", None)
    if not isinstance(ids, TokenIds):
        return None
    return describe_ids(ids, tokens)


# --------------------------------------------------------------------------- output folder
class GameWriter:
    """The output folder of a game, brought up to date after every turn (clips, game.json, index.html)."""

    def __init__(self, game: Game, out_dir: str | Path, overwrite: bool = False, extra: Optional[dict] = None):
        self.game, self.out_dir = game, Path(out_dir)
        self.extra = dict(extra or {})
        self.out_dir.mkdir(parents=True, exist_ok=True)
        if (self.out_dir / GAME_FILE).exists():
            if not overwrite:
                raise OutputExistsError(f"{self.out_dir} already holds a game ({GAME_FILE}); choose another folder "
                                        "or overwrite it (--overwrite)")
            played = [*self.out_dir.glob("turn_*.mp4"), *self.out_dir.glob(f"turn_*{POSTER_SUFFIX}")]
            for old in [*played, self.out_dir / GAME_FILE, self.out_dir / INDEX_FILE]:
                old.unlink(missing_ok=True)
        self.turns: list[dict] = []
        self.error: Optional[str] = None
        self.write_index()

    def add(self, result: TurnResult) -> Path:
        from animegamer.utils.io import write_bytes_atomic
        from animegamer.media.video import encode_mp4

        clips = self.game.cfg.pipeline.clips
        t0 = time.perf_counter()
        path = self.out_dir / clip_name(result.index)
        write_bytes_atomic(path, encode_mp4(result.frames, clips.fps, clips))
        save_poster(result.frames[0], poster_path(path))
        record = result.to_record()
        record["timings"]["encode_mp4"] = round(time.perf_counter() - t0, 4)
        self.turns.append(record)
        self.write_index()
        return path

    def record(self) -> dict:
        game, cfg = self.game, self.game.cfg
        clips = cfg.pipeline.clips
        totals = [t["timings"]["total"] for t in self.turns]
        return {
            "format_version": GAME_FORMAT_VERSION,
            "seed": game.seed,
            "window_turns": game.window_turns,
            "initial_states": {k: INITIAL_STATE for k in CHARACTER_STATES},
            "state_rule": f"clamp(value + {STATE_STEP} * delta, {STATE_RANGE[0]}, {STATE_RANGE[1]})",
            "states": game.states,
            "level_flow": {str(k): v for k, v in sorted(game.models.level_flow.items())},
            "clips": {"fps": clips.fps, "frames": clips.frames, "height": clips.height, "width": clips.width},
            "sampling": {"steps": game.diffusion.sampling_steps, "guidance_scale": game.diffusion.guidance_scale,
                         "guidance_exponent": game.diffusion.guidance_exponent, "cache": game.diffusion.cache,
                         "cache_threshold": game.diffusion.cache_threshold},
            "model": cfg.model.name,
            "sources": game.models.sources,
            "seconds_per_turn": round(sum(totals) / len(totals), 4) if totals else None,
            "error": self.error,
            **self.extra,
            "turns": self.turns,
        }

    def write_index(self) -> dict:
        from animegamer.game_html import write_storyboard
        from animegamer.utils.io import write_json_atomic

        record = self.record()
        write_json_atomic(self.out_dir / GAME_FILE, record)
        write_storyboard(self.out_dir / INDEX_FILE, record)
        return record

    def fail(self, error: BaseException) -> None:
        """Record why the game stopped (the files of the turns played stay)."""
        self.error = str(error)
        self.write_index()


def play_game(models: GameModels, instructions: Iterable[str], out_dir: str | Path, seed: int = 0, *,
              window_turns: Optional[int] = None, predict_fn: Optional[PredictFn] = None, sampling_steps: int = 0,
              overwrite: bool = False, on_turn: Optional[Callable[[TurnResult], None]] = None,
              extra: Optional[dict] = None) -> dict:
    """Play every instruction in order, writing the folder as it goes; returns game.json's content.

    ``window_turns`` is the MLLM's window (``Game``), not a limit on the turns played: every instruction
    is played. ``extra`` adds keys to game.json. A malformed state generation raises ValueError naming
    the turn; game.json then records the error and the turns played before it.
    """
    callback = None if on_turn is None else (lambda _number, result: on_turn(result))
    [played] = play_games(models, [instructions], [out_dir], seed, window_turns=window_turns, predict_fn=predict_fn,
                          sampling_steps=sampling_steps, overwrite=overwrite, on_turn=callback, extra=extra)
    if played.error is not None:
        raise played.error
    return played.record


def check_batch_games(key: str, value) -> list[str]:
    """Games played at once: a whole number >= 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return [f"{key}={value!r}: must be a whole number >= 1 (games played at once; 1 plays them one at a time)"]
    return []


@dataclass
class PlayedGame:
    """A game of :func:`play_games`: game.json's content, its played turns and why it stopped early."""

    record: dict
    results: list[TurnResult]
    error: Optional[ValueError]  # the failed turn's error (the game ends there); None: every instruction played


def play_games(models: GameModels, scripts: Sequence[Iterable[str]], out_dirs: Sequence[str | Path], seed: int = 0,
               *, batch_games: int = 1, window_turns: Optional[int] = None, predict_fn: Optional[PredictFn] = None,
               sampling_steps: int = 0, overwrite: bool = False,
               on_turn: Optional[Callable[[int, TurnResult], None]] = None,
               extra: Optional[dict] = None) -> list[PlayedGame]:
    """Play several games, up to ``batch_games`` of them advancing together through :func:`play_turns`.

    Games start in order; a game whose script ends, or whose turn fails with a ValueError (recorded in
    its game.json and its ``PlayedGame.error``), leaves the batch and the next game takes its place.
    Every game gets the same turns, states and clips as played alone with ``seed`` (``batch_games=1``
    plays them one after another). ``on_turn(game_number, result)`` runs after each written turn. Any
    other error stops every game, recorded in the game.json of those in the batch, and propagates.
    """
    problems = check_batch_games("batch_games", batch_games)
    if problems:
        raise ValueError(problems[0])
    if len(scripts) != len(out_dirs):
        raise ValueError(f"{len(scripts)} scripts and {len(out_dirs)} output folders: need one folder per game")
    waiting = list(range(len(scripts)))[::-1]  # popped from the end: game 0 first
    played: list[Optional[PlayedGame]] = [None] * len(scripts)
    active: list[tuple[int, Game, GameWriter, Iterator[str]]] = []

    def finish(number: int, game: Game, writer: GameWriter, error: Optional[ValueError] = None) -> None:
        if error is not None:
            writer.fail(error)
        played[number] = PlayedGame(writer.record(), list(game.results), error)

    while waiting or active:
        # The playing games' next instructions; a game whose script ended frees its slot at once.
        turn, candidates, active = [], active, []
        while candidates or (waiting and len(turn) < batch_games):
            if candidates:
                entry = candidates.pop(0)
            else:
                number = waiting.pop()
                game = Game(models, seed=seed, window_turns=window_turns, predict_fn=predict_fn,
                            sampling_steps=sampling_steps)
                entry = (number, game, GameWriter(game, out_dirs[number], overwrite=overwrite, extra=extra),
                         iter(scripts[number]))
            instruction = next(entry[3], None)
            if instruction is None:
                finish(*entry[:3])
            else:
                turn.append((entry, instruction))
        if not turn:
            continue
        try:
            outcomes = play_turns([entry[1] for entry, _ in turn], [instruction for _, instruction in turn])
        except Exception as error:
            for (_, _, writer, _), _ in turn:
                writer.fail(error)
            raise
        for (entry, _), outcome in zip(turn, outcomes):
            number, game, writer, _ = entry
            if isinstance(outcome, ValueError):
                finish(number, game, writer, outcome)
                continue
            writer.add(outcome)
            if on_turn is not None:
                on_turn(number, outcome)
            active.append(entry)
    return played


# --------------------------------------------------------------------------- command line
def read_instructions(path: str | Path) -> list[str]:
    """One instruction per line; blank lines and lines starting with ``#`` are skipped."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]


def stdin_instructions(stream=None, prompt: bool = True) -> Iterable[str]:
    """Instructions typed one per line; an empty line or EOF ends the game."""
    stream = stream or sys.stdin
    while True:
        if prompt:
            print("instruction (empty line ends)> ", end="", file=sys.stderr, flush=True)
        line = stream.readline()
        if not line or not line.strip():
            return
        yield line.strip()


DTYPES = {"auto": None, "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m animegamer.game", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mllm", default="", help="phase (b) export folder")
    parser.add_argument("--renderer", action="append", default=[],
                        help="phase (c) export folder (or phase (a)); repeat to load several in order")
    parser.add_argument("--clips-manifest", required=True,
                        help="pipeline manifest.json (or its folder) with motion_bins.level_flow")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--instructions", help="text file, one instruction per line")
    source.add_argument("--interactive", action="store_true", help="read instructions from stdin")
    parser.add_argument("--out", required=True, help="output folder (clips, game.json, index.html)")
    parser.add_argument("--seed", type=int, default=None, help="sampler seed (default: the config's seed)")
    parser.add_argument("--max-turns", type=int, default=0,
                        help="stop after this many turns (default 0: play every instruction, or until an empty line)")
    parser.add_argument("--window-turns", type=int, default=0,
                        help="turns the MLLM sees, the new one included: the last N-1 played turns are its history "
                             "(default K, the number of window lengths phase (b) trained on: data.window_weights)")
    parser.add_argument("--sampling-steps", type=int, default=0, help="DPM++ steps (default from the config)")
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="auto",
                        help="model dtype (auto: bfloat16 on CUDA, float32 on CPU)")
    parser.add_argument("--constrained-states", action="store_true",
                        help="decode the states within the layout (model.mllm.constrained_states=true): never "
                             "malformed, for briefly trained exports")
    parser.add_argument("--overwrite", action="store_true", help="replace a game already in --out")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of the train config (model=..., ...; "
                                                      "default model: the preset the exports were trained with)")
    return parser


def _input_problems(args: argparse.Namespace, cfg: RunConfig) -> list[str]:
    """Every missing or mismatched input of the command line, found before any model is built."""
    from animegamer.checkpoints.export import export_folder_problems
    from animegamer.checkpoints.export_checks import check_export_role, check_export_sizes

    problems = []
    if args.max_turns < 0 or args.window_turns < 0:
        problems.append(f"--max-turns {args.max_turns} / --window-turns {args.window_turns}: must be >= 0")
    exports = [("--mllm", args.mllm, "mllm")] if args.mllm else []
    exports += [("--renderer", folder, "renderer") for folder in args.renderer]
    for option, folder, role in exports:
        missing = export_folder_problems(f"{option} {folder}", folder, hint="train the phase first")
        problems += missing or check_export_role(option, folder, role) or check_export_sizes(option, folder, cfg.model)
    manifest = Path(args.clips_manifest)
    if not (manifest / MANIFEST if manifest.is_dir() else manifest).is_file():
        problems.append(f"--clips-manifest {manifest}: no such {MANIFEST} (run the pipeline first)")
    if args.instructions and not Path(args.instructions).is_file():
        problems.append(f"--instructions {args.instructions}: no such file")
    if (Path(args.out) / GAME_FILE).exists() and not args.overwrite:
        problems.append(f"--out {args.out} already holds a game ({GAME_FILE}); choose another folder or --overwrite")
    return problems


@exit_on_user_error
def main(argv: Optional[Sequence[str]] = None) -> int:
    """The command line; returns 0, or 1 when a malformed generation stopped the game. A wrong input
    (path, override, an --out that holds a game) exits with code 2 and its message, no traceback."""
    from itertools import islice

    from omegaconf import OmegaConf

    from animegamer.config.compose import compose_config
    from animegamer.checkpoints.trained_data import preset_overrides
    from animegamer.config.validate import ConfigError
    from animegamer.utils.logging import setup_logging

    args = build_parser().parse_intermixed_args(argv)
    overrides = preset_overrides(list(args.overrides), [args.mllm, *args.renderer])
    if args.constrained_states:
        overrides.append("model.mllm.constrained_states=true")
    cfg: RunConfig = OmegaConf.to_object(compose_config("train", overrides))
    setup_logging(cfg.log_level)
    problems = _input_problems(args, cfg)
    if problems:
        raise ConfigError(problems)
    instructions = read_instructions(args.instructions) if args.instructions else None
    if instructions is not None and not instructions:
        raise UserError(f"{args.instructions}: no instructions")
    if args.max_turns and instructions is not None and len(instructions) > args.max_turns:
        log.info("--max-turns %d: playing the first %d of %d instructions", args.max_turns, args.max_turns,
                 len(instructions))
    script = instructions if instructions is not None else stdin_instructions()
    models = load_game_models(cfg, args.mllm, args.renderer, read_level_flow(args.clips_manifest),
                              device=args.device, dtype=DTYPES[args.dtype])
    seed = cfg.seed if args.seed is None else args.seed
    try:
        record = play_game(models, islice(script, args.max_turns or None), args.out, seed,
                           window_turns=args.window_turns or None, sampling_steps=args.sampling_steps,
                           overwrite=args.overwrite,
                           extra={"turn_limit": args.max_turns or None})
    except ValueError as error:
        log.error("game stopped: %s", error)
        return 1
    log.info("%d turns, final states %s: %s", len(record["turns"]), record["states"], Path(args.out) / INDEX_FILE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
