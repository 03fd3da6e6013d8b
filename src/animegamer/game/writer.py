"""A game's output folder: a clip and its poster per turn, game.json (the full log) and index.html
(the storyboard), brought up to date after every turn."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

from animegamer.contracts.files import GAME_PAGE_FILE
from animegamer.contracts.states import CHARACTER_STATES
from animegamer.errors import OutputExistsError
from animegamer.game.html import write_storyboard
from animegamer.game.state import INITIAL_STATE, STATE_RANGE, STATE_STEP, TurnResult, clip_name
from animegamer.game.turns import Game
from animegamer.media.video import encode_mp4
from animegamer.pages import POSTER_SUFFIX, poster_path, save_poster
from animegamer.utils.io import out_dir_problem, write_bytes_atomic, write_json_atomic

GAME_FILE = "game.json"
GAME_FORMAT_VERSION = 2  # 2: "window_turns" (was "max_turns"), a poster (turn_NNN.jpg) beside each clip


class GameWriter:
    """The output folder of a game, brought up to date after every turn (clips, game.json, index.html)."""

    def __init__(self, game: Game, out_dir: str | Path, overwrite: bool = False, extra: Optional[dict] = None):
        self.game, self.out_dir = game, Path(out_dir)
        self.extra = dict(extra or {})
        problem = out_dir_problem(self.out_dir)
        if problem:
            raise OutputExistsError(f"{problem}; choose another output folder")
        self.out_dir.mkdir(parents=True, exist_ok=True)
        if (self.out_dir / GAME_FILE).exists():
            if not overwrite:
                raise OutputExistsError(f"{self.out_dir} already holds a game ({GAME_FILE}); choose another folder "
                                        "or overwrite it (--overwrite)")
            played = [*self.out_dir.glob("turn_*.mp4"), *self.out_dir.glob(f"turn_*{POSTER_SUFFIX}")]
            for old in [*played, self.out_dir / GAME_FILE, self.out_dir / GAME_PAGE_FILE]:
                old.unlink(missing_ok=True)
        self.turns: list[dict] = []
        self.error: Optional[str] = None
        self.write_index()

    def add(self, result: TurnResult) -> Path:
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
        record = self.record()
        write_json_atomic(self.out_dir / GAME_FILE, record)
        write_storyboard(self.out_dir / GAME_PAGE_FILE, record)
        return record

    def fail(self, error: BaseException) -> None:
        """Record why the game stopped (the files of the turns played stay)."""
        self.error = str(error)
        self.write_index()
