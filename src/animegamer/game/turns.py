"""One game (``Game``: states, history, the pieces of a turn) and one turn of several games played as a
batch (``play_turns``): the MLLM, the sampler and the VAE each run once on the batch."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from typing import Callable, Optional, Sequence

import numpy as np
import torch

from animegamer.contracts.states import CHARACTER_STATES, ENTERTAINMENT, MOTION_LEVEL, PLAYED_STATES, SOCIAL, STAMINA
from animegamer.game.models import GameModels
from animegamer.game.render import decode_frames, render_latents
from animegamer.game.state import INITIAL_STATE, TurnResult, update_states
from animegamer.mllm.predict import HistoryTurn, Prediction, generate_rows, prompts_batch, window
from animegamer.mllm.sequence import Turn, describe_ids, parse_states
from animegamer.mllm.tokens import TokenIds
from animegamer.utils.randomness import step_seed

log = logging.getLogger("animegamer.game")  # the game's logger, one name for every part of it

# predict_fn(model, tokenizer, ids, history, instruction, window_turns) -> Prediction (predict_next's signature)
PredictFn = Callable[..., Prediction]


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
        """The turns this object played (a resumed game's earlier turns are in its game.json)."""
        return tuple(self._results)

    @property
    def turn_index(self) -> int:
        """The number of the next turn (0-based; a resumed game counts the turns it resumed after)."""
        return len(self._history)

    def turn_seed(self, index: int) -> int:
        return step_seed(self.seed, index, 0)

    def resume_from(self, turns: Sequence[dict], reps: Sequence[torch.Tensor]) -> None:
        """Continue after ``turns`` (game.json's records of the turns played, oldest first) with their
        representations ``reps`` (N, D): the states and the MLLM's history are theirs, so the next turn
        is the one an uninterrupted game would have played."""
        if self._history:
            raise ValueError("a game resumes before its first turn")
        for record, rep in zip(turns, reps, strict=True):
            self._history.append(HistoryTurn(Turn(record["instruction"], record[PLAYED_STATES]), rep.float()))
            self._states = {k: int(v) for k, v in record["states_after"].items()}

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
    ids = getattr(mllm, "ids", None)
    if not isinstance(ids, TokenIds):
        return None
    return describe_ids(ids, tokens)
