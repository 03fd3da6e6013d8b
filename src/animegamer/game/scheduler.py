"""Playing whole games: ``play_games`` keeps up to ``batch_games`` games advancing together, a game that
ends giving its place to the next; ``play_game`` plays one."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator, Optional, Sequence

from animegamer.game.models import GameModels
from animegamer.game.state import TurnResult
from animegamer.game.turns import Game, PredictFn, play_turns
from animegamer.game.writer import GameWriter


def play_game(models: GameModels, instructions: Iterable[str], out_dir: str | Path, seed: int = 0, *,
              window_turns: Optional[int] = None, predict_fn: Optional[PredictFn] = None, sampling_steps: int = 0,
              overwrite: bool = False, resume: bool = False, on_turn: Optional[Callable[[TurnResult], None]] = None,
              extra: Optional[dict] = None) -> dict:
    """Play every instruction in order, writing the folder as it goes; returns game.json's content.

    ``window_turns`` is the MLLM's window (``Game``), not a limit on the turns played: every instruction
    is played. ``extra`` adds keys to game.json. A malformed state generation raises ValueError naming
    the turn; game.json then records the error and the turns played before it.
    """
    callback = None if on_turn is None else (lambda _number, result: on_turn(result))
    [played] = play_games(models, [instructions], [out_dir], seed, window_turns=window_turns, predict_fn=predict_fn,
                          sampling_steps=sampling_steps, overwrite=overwrite, resume=resume, on_turn=callback,
                          extra=extra)
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
               sampling_steps: int = 0, overwrite: bool = False, resume: bool = False,
               on_turn: Optional[Callable[[int, TurnResult], None]] = None,
               extra: Optional[dict] = None) -> list[PlayedGame]:
    """Play several games, up to ``batch_games`` of them advancing together through :func:`play_turns`.

    Games start in order; a game whose script ends, or whose turn fails with a ValueError (recorded in
    its game.json and its ``PlayedGame.error``), leaves the batch and the next game takes its place.
    Every game gets the same turns, states and clips as played alone with ``seed`` (``batch_games=1``
    plays them one after another). ``on_turn(game_number, result)`` runs after each written turn. Any
    other error stops every game, recorded in the game.json of those in the batch, and propagates.
    ``resume``: a game whose folder holds an unfinished game (:func:`~animegamer.game.writer.unfinished_game`)
    continues it; its script then holds only the turns still to play.
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
        writer.close(error)
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
                writer = GameWriter(game, out_dirs[number], overwrite=overwrite, extra=extra, resume=resume)
                entry = (number, game, writer, iter(scripts[number]))
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
