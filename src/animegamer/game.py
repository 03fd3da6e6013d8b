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

from functools import partial

import argparse
import logging
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Mapping, Optional, Sequence

import numpy as np
import torch

from animegamer.config.schema import RunConfig
from animegamer.data.shards import MANIFEST
from animegamer.errors import InvalidInputError, OutputExistsError, UserError, exit_on_user_error
from animegamer.mllm.predict import HistoryTurn, Prediction, predict_next, window
from animegamer.mllm.sequence import Turn
from animegamer.pages import POSTER_SUFFIX, poster_path, save_poster
from animegamer.utils.randomness import step_seed

log = logging.getLogger("animegamer.game")  # the same name under ``python -m animegamer.game``

__all__ = [
    "CHARACTER_STATES", "INITIAL_STATE", "STATE_STEP", "STATE_RANGE", "GameModels", "TurnResult", "Game",
    "GameWriter", "load_game_models", "play_game", "update_states", "read_level_flow",
    "read_instructions", "window", "main",
]

CHARACTER_STATES = ("SC", "ET", "ST")  # social, entertainment, stamina: the bars the player sees
STATE_NAMES = {"SC": "Social", "ET": "Entertainment", "ST": "Stamina"}
INITIAL_STATE = 50  # official demo
STATE_STEP = 5  # one unit of predicted delta moves a bar by 5
STATE_RANGE = (0, 100)
MOTION_LEVELS = (1, 2, 3, 4, 5)
GAME_FILE = "game.json"
INDEX_FILE = "index.html"
GAME_FORMAT_VERSION = 2  # 2: "window_turns" (was "max_turns"), a poster (turn_NNN.jpg) beside each clip

# predict_fn(model, tokenizer, ids, history, instruction, window_turns) -> Prediction (predict_next's signature)
PredictFn = Callable[..., Prediction]


def clip_name(index: int) -> str:
    return f"turn_{index:03d}.mp4"


# --------------------------------------------------------------------------- models
@dataclass
class GameModels:
    """Everything a turn runs: MLLM (a ``TokenizedMLLM`` or any object with ``.model``, ``.tokenizer``,
    ``.ids``), renderer (``ReconstructionModel``: its encoder gives the unconditional branch, its decoder
    samples), the VAE, the level -> flow table and the run config."""

    mllm: object
    renderer: torch.nn.Module
    vae: torch.nn.Module
    level_flow: dict[int, float]
    cfg: RunConfig
    sources: dict = field(default_factory=dict)  # where the weights came from (recorded in game.json)

    def __post_init__(self) -> None:
        self.level_flow = check_level_flow(self.level_flow)

    @property
    def device(self) -> torch.device:
        return next(self.renderer.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.renderer.parameters()).dtype


def check_level_flow(level_flow: Mapping) -> dict[int, float]:
    """``{level: flow}`` with int keys (a manifest's json has string keys); every level 1..5 present."""
    table = {int(k): float(v) for k, v in dict(level_flow).items()}
    missing = [level for level in MOTION_LEVELS if level not in table]
    if missing:
        raise ValueError(f"level_flow lacks motion levels {missing}: got {table}")
    return table


def read_level_flow(manifest: str | Path) -> dict[int, float]:
    """``motion_bins.level_flow`` of a pipeline manifest (a ``manifest.json`` or the folder holding one)."""
    import json

    path = Path(manifest)
    if path.is_dir():
        path = path / MANIFEST
    data = json.loads(path.read_text())
    try:
        table = data["motion_bins"]["level_flow"]
    except (KeyError, TypeError):
        message = f"{path}: no motion_bins.level_flow (not a clips/features/sessions manifest?)"
        raise InvalidInputError(message) from None
    return check_level_flow(table)


def _as_list(exports: str | Path | Sequence[str | Path] | None) -> list[str]:
    if exports is None or exports == "":
        return []
    if isinstance(exports, (str, Path)):
        return [str(exports)]
    return [str(e) for e in exports if str(e)]


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def merge_for_play(model) -> None:
    """Playing never trains: fold a LoRA adapter (MLLM or decoder) into its weights, in float32 before
    the cast: one matmul per projection instead of three (the unmerged MLLM stage measured 2.2x the
    plain one)."""
    if model.has_lora:
        model.merge_lora()


def _frozen(module: torch.nn.Module, device, dtype) -> torch.nn.Module:
    return module.to(device=device, dtype=dtype).eval().requires_grad_(False)


@torch.no_grad()
def load_game_models(cfg: RunConfig, mllm_export: str | Path | None,
                     renderer_export: str | Path | Sequence[str | Path] | None, level_flow: Mapping,
                     *, device: str | torch.device | None = None, dtype: torch.dtype | None = None) -> GameModels:
    """Build the MLLM, renderer and VAE from ``cfg`` and load the trained exports over them.

    ``mllm_export``: a phase (b) export folder. ``renderer_export``: a phase (c) export (it carries the
    encoder too, so it stands alone) or a phase (a) one, or several applied in order; the decoder
    gets its LoRA first when any of them holds LoRA tensors. Official checkpoints named in
    the config are imported before the exports, as the training phases do. Either export may be
    empty when the config's official checkpoint provides that network. Everything ends frozen, in
    eval mode, on ``device`` (CUDA when available) in ``dtype`` (bfloat16 on CUDA, float32 on CPU).
    """
    from animegamer.config.validate import ConfigError
    from animegamer.models.decoder import check_decoder_compile
    from animegamer.models.frozen_encoders import build_frozen_encoders
    from animegamer.models.game_mllm import build_game_mllm
    from animegamer.models.reconstruction import build_reconstruction

    problems = check_decoder_compile(cfg.model.decoder, training=False)
    if problems:
        raise ConfigError(problems)
    device = torch.device(device or default_device())
    if dtype is None:
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    level_flow = check_level_flow(level_flow)
    from animegamer.config.trained_data import at_clip_size, renderer_clip_size

    cfg = at_clip_size(cfg, renderer_clip_size(_as_list(renderer_export)))  # render at the trained clip size

    mllm_exports = _as_list(mllm_export)
    if not mllm_exports and not cfg.model.mllm.official_checkpoint:
        raise ValueError("no MLLM weights: give a phase (b) export or set model.mllm.official_checkpoint")
    mllm = build_game_mllm(cfg, mllm_exports)
    merge_for_play(mllm.model)
    mllm.model = _frozen(mllm.model, device, dtype)

    renderer_exports = _as_list(renderer_export)
    if not renderer_exports and not cfg.model.decoder.official_checkpoint:
        raise ValueError("no renderer weights: give a phase (a) export or set model.decoder.official_checkpoint")
    renderer = build_reconstruction(cfg, renderer_exports)
    merge_for_play(renderer.decoder)
    renderer = _frozen(renderer, device, dtype)

    vae = build_frozen_encoders(cfg.model.encoders, device=device, dtype=dtype, which=("vae",)).vae
    sources = {"mllm": mllm_exports, "renderer": renderer_exports, "device": str(device),
               "dtype": str(dtype).removeprefix("torch."),
               "official": {"mllm": cfg.model.mllm.official_checkpoint,
                            "decoder": cfg.model.decoder.official_checkpoint}}
    log.info("game models on %s (%s): mllm %s, renderer %s", device, dtype, mllm_exports, renderer_exports)
    return GameModels(mllm, renderer, vae, level_flow, cfg, sources)


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
    more than ``window_turns - 1``, oldest first); tests inject a stub. ``window_turns`` defaults to K, the
    number of window lengths phase (b) trained on (``len(cfg.data.window_weights)``).
    """

    def __init__(self, models: GameModels, seed: int = 0, window_turns: Optional[int] = None,
                 predict_fn: Optional[PredictFn] = None, sampling_steps: int = 0) -> None:
        self.models = models
        self.cfg = models.cfg
        self.seed = int(seed)
        self.window_turns = int(window_turns if window_turns else len(self.cfg.data.window_weights))
        if self.window_turns < 1:
            raise ValueError(f"window_turns must be >= 1, got {self.window_turns}")
        if predict_fn is None:
            constrained = models.cfg.model.mllm.constrained_states
            predict_fn = partial(predict_next, constrained=True) if constrained else predict_next
        self.predict_fn = predict_fn
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
        from animegamer.diffusion.sampler import sample

        index = self.turn_index
        if not isinstance(instruction, str) or not instruction.strip():
            raise ValueError(f"turn {index}: the instruction must be a non-empty string, got {instruction!r}")
        models, timings = self.models, {}
        mllm = models.mllm
        start = time.perf_counter()
        past = window(self._history, self.window_turns)
        try:
            prediction = self.predict_fn(mllm.model, mllm.tokenizer, mllm.ids, past, instruction, self.window_turns)
        except ValueError as error:
            raise ValueError(f"turn {index} ({instruction!r}): {error}") from error
        self._sync()
        timings["mllm"] = time.perf_counter() - start

        predicted = {k: int(v) for k, v in prediction.states.items()}
        turn = Turn(instruction, predicted)  # validates keys and ranges
        level = turn.states["ML"]
        flow = self.flow_for(level)
        rep = prediction.rep.detach().float().cpu()

        t0 = time.perf_counter()
        seed = self.turn_seed(index)
        generator = torch.Generator(device="cpu").manual_seed(seed)  # same draws on every device
        device, dtype = models.device, models.dtype
        latents = sample(models.renderer.decoder, self.latent_shape, rep[None].to(device),
                         self._unconditional(), torch.tensor([flow], device=device), self.diffusion, generator,
                         dtype=dtype)
        self._sync()
        timings["sample"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        video = models.vae.decode(latents)[0]  # (T, H, W, 3) in [0, 1]
        frames = (video.float().clamp(0, 1) * 255).round().to(torch.uint8).cpu().numpy()
        timings["vae_decode"] = time.perf_counter() - t0
        expected = (self.frames, self.height, self.width, 3)
        if frames.shape != expected:
            raise RuntimeError(f"turn {index}: decoded clip {frames.shape}, expected {expected}")
        timings["total"] = time.perf_counter() - start

        before = self.states
        after = update_states(before, turn.states)
        result = TurnResult(index=index, instruction=instruction, tokens=[int(t) for t in prediction.tokens],
                            token_text=_token_text(mllm, prediction.tokens), predicted=dict(turn.states),
                            states_before=before, states_after=after, motion_level=level, flow=flow, seed=seed,
                            frames=frames, rep=rep, timings=timings)
        self._states = after
        self._history.append(HistoryTurn(turn, rep))
        self._results.append(result)
        log.info("turn %d: ML %d (flow %.3f) SC %+d ET %+d ST %+d -> %s in %.2fs", index, level, flow,
                 predicted["SC"], predicted["ET"], predicted["ST"], after, timings["total"])
        return result


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
        from data_pipeline.clips import encode_mp4

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
                         "guidance_exponent": game.diffusion.guidance_exponent},
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
    game = Game(models, seed=seed, window_turns=window_turns, predict_fn=predict_fn, sampling_steps=sampling_steps)
    writer = GameWriter(game, out_dir, overwrite=overwrite, extra=extra)
    for instruction in instructions:
        try:
            result = game.play_turn(instruction)
        except Exception as error:
            writer.fail(error)
            raise
        writer.add(result)
        if on_turn is not None:
            on_turn(result)
    return writer.record()


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
    parser.add_argument("--overwrite", action="store_true", help="replace a game already in --out")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of the train config (model=..., ...)")
    return parser


def _input_problems(args: argparse.Namespace, cfg: RunConfig) -> list[str]:
    """Every missing or mismatched input of the command line, found before any model is built."""
    from animegamer.checkpoints.export import TRAINED_FILE
    from animegamer.checks import check_export_sizes

    problems = []
    if args.max_turns < 0 or args.window_turns < 0:
        problems.append(f"--max-turns {args.max_turns} / --window-turns {args.window_turns}: must be >= 0")
    exports = [("--mllm", args.mllm)] if args.mllm else []
    exports += [("--renderer", folder) for folder in args.renderer]
    for option, folder in exports:
        if not (Path(folder) / TRAINED_FILE).is_file():
            problems.append(f"{option} {folder}: not an export folder (no {TRAINED_FILE}; train the phase first)")
        else:
            problems += check_export_sizes(option, folder, cfg.model)
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
    from animegamer.config.validate import ConfigError
    from animegamer.utils.logging import setup_logging

    args = build_parser().parse_intermixed_args(argv)
    cfg: RunConfig = OmegaConf.to_object(compose_config("train", list(args.overrides)))
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
