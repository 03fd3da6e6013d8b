"""A game's output folder: a clip and its poster per turn, game.json (the full log) and index.html
(the storyboard), brought up to date after every turn."""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Optional

from safetensors.torch import save as save_tensors

from animegamer.checkpoints.safe_load import load_safetensors

from animegamer.contracts.files import GAME_MODEL_KEY, GAME_PAGE_FILE, GAME_WINDOW_KEY
from animegamer.contracts.states import CHARACTER_STATES
from animegamer.errors import OutputExistsError
from animegamer.game.html import write_storyboard
from animegamer.game.state import INITIAL_STATE, STATE_RANGE, STATE_STEP, TurnResult, clip_name
from animegamer.game.turns import Game
from animegamer.media.video import encode_mp4
from animegamer.pages import POSTER_SUFFIX, poster_path, save_poster
from animegamer.utils.io import out_dir_problem, read_json_if_exists, write_bytes_atomic, write_json_atomic
from animegamer.utils.text import count_of

log = logging.getLogger(__name__)

GAME_FILE = "game.json"
# 2: "window_turns" (was "max_turns"), a poster (turn_NNN.jpg) beside each clip; 3: "finished", and each
# turn's representation (turn_NNN.rep.safetensors), which the MLLM's history of a resumed game needs.
GAME_FORMAT_VERSION = 3
FINISHED = "finished"
REP_SUFFIX = ".rep.safetensors"
REP_KEY = "rep"
CONSTRAINED_KEY = "constrained_states"  # the states decoded within the layout (play --constrained-states)
# What a resumed game must share with the game it continues (the turns' seeds, window, clips, decoding and models).
RESUME_KEYS = ("seed", GAME_WINDOW_KEY, "level_flow", "clips", "sampling", CONSTRAINED_KEY, GAME_MODEL_KEY, "sources")


def rep_path(clip: Path) -> Path:
    return clip.with_name(clip.name.split(".")[0] + REP_SUFFIX)


def unfinished_game(out_dir: str | Path) -> Optional[dict]:
    """game.json of a game in ``out_dir`` that was stopped before its script ended (Ctrl-C, a crash), which
    the same command resumes; None for no game, a finished one, or one written before games could resume."""
    try:
        record = read_json_if_exists(Path(out_dir) / GAME_FILE)
    except ValueError:  # not JSON: not a game this command can take up
        return None
    if not isinstance(record, dict) or record.get("format_version") != GAME_FORMAT_VERSION:
        return None
    return record if record.get(FINISHED) is False else None


class GameWriter:
    """The output folder of a game, brought up to date after every turn (clips, game.json, index.html)."""

    def __init__(self, game: Game, out_dir: str | Path, overwrite: bool = False, extra: Optional[dict] = None,
                 resume: bool = False):
        """``resume``: an unfinished game in ``out_dir`` (:func:`unfinished_game`) is taken up where it
        stopped; otherwise a game already there needs ``overwrite``."""
        self.game, self.out_dir = game, Path(out_dir)
        self.extra = dict(extra or {})
        problem = out_dir_problem(self.out_dir)
        if problem:
            raise OutputExistsError(f"{problem}; choose another output folder")
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.turns: list[dict] = []
        self.error: Optional[str] = None
        self.finished = False
        earlier = unfinished_game(self.out_dir) if resume else None
        if earlier is not None:
            self._resume(earlier)
        elif (self.out_dir / GAME_FILE).exists():
            if not overwrite:
                raise OutputExistsError(f"{self.out_dir} already holds a game ({GAME_FILE}); choose another folder "
                                        "or overwrite it (--overwrite)")
            played = [*self.out_dir.glob("turn_*.mp4"), *self.out_dir.glob(f"turn_*{POSTER_SUFFIX}"),
                      *self.out_dir.glob(f"turn_*{REP_SUFFIX}")]
            for old in [*played, self.out_dir / GAME_FILE, self.out_dir / GAME_PAGE_FILE]:
                old.unlink(missing_ok=True)
        self.write_index()

    def _resume(self, earlier: dict) -> None:
        """Take up the game ``earlier`` (game.json's content) where it stopped, refusing one played with
        other settings or models."""
        now = self.record()
        differ = [key for key in RESUME_KEYS if earlier.get(key) != now.get(key)]
        if differ:
            raise OutputExistsError(
                f"{self.out_dir} holds an unfinished game played with other settings ({', '.join(differ)}: "
                f"{', '.join(f'{earlier.get(k)!r} -> {now.get(k)!r}' for k in differ)}); resume it with its own "
                f"settings, choose another folder, or start it again (--overwrite)")
        turns = earlier["turns"]
        reps = []
        for turn in turns:
            path = rep_path(self.out_dir / turn["video"])
            try:
                reps.append(load_safetensors(path)[REP_KEY])
            except (FileNotFoundError, KeyError, ValueError) as error:
                raise OutputExistsError(f"{path}: turn {turn['index']}'s representation, which a resume needs, "
                                        f"cannot be read ({error}); start the game again (--overwrite)") from None
        self.game.resume_from(turns, reps)
        self.turns = list(turns)
        log.info("resuming the game in %s after its %s", self.out_dir, count_of(len(turns), "turn"))

    def add(self, result: TurnResult) -> Path:
        clips = self.game.cfg.pipeline.clips
        t0 = time.perf_counter()
        path = self.out_dir / clip_name(result.index)
        write_bytes_atomic(path, encode_mp4(result.frames, clips.fps, clips))
        save_poster(result.frames[0], poster_path(path))
        write_bytes_atomic(rep_path(path), save_tensors({REP_KEY: result.rep.float().contiguous()}))
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
            GAME_WINDOW_KEY: game.window_turns,
            "initial_states": {k: INITIAL_STATE for k in CHARACTER_STATES},
            "state_rule": f"clamp(value + {STATE_STEP} * delta, {STATE_RANGE[0]}, {STATE_RANGE[1]})",
            "states": game.states,
            "level_flow": {str(k): v for k, v in sorted(game.models.level_flow.items())},
            "clips": {"fps": clips.fps, "frames": clips.frames, "height": clips.height, "width": clips.width},
            "sampling": {"steps": game.diffusion.sampling_steps, "guidance_scale": game.diffusion.guidance_scale,
                         "guidance_exponent": game.diffusion.guidance_exponent, "cache": game.diffusion.cache,
                         "cache_threshold": game.diffusion.cache_threshold},
            CONSTRAINED_KEY: bool(cfg.model.mllm.constrained_states),
            GAME_MODEL_KEY: cfg.model.name,
            "sources": game.models.sources,
            "seconds_per_turn": round(sum(totals) / len(totals), 4) if totals else None,
            "error": self.error,
            FINISHED: self.finished,
            **self.extra,
            "turns": self.turns,
        }

    def write_index(self) -> dict:
        record = self.record()
        write_json_atomic(self.out_dir / GAME_FILE, record)
        write_storyboard(self.out_dir / GAME_PAGE_FILE, record)
        return record

    def close(self, error: Optional[BaseException] = None) -> None:
        """The script has ended, or a turn failed with ``error`` (playing it again would repeat it): nothing
        to resume."""
        self.finished = True
        self.error = None if error is None else str(error)
        self.write_index()

    def fail(self, error: BaseException) -> None:
        """Record why the game stopped (the files of the turns played stay)."""
        self.error = str(error)
        self.write_index()
