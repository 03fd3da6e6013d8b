"""The game loop on tiny random networks: clips, state log, level -> flow, sliding window, errors, CLI."""
from __future__ import annotations

import io
import json
import re
import shutil
from dataclasses import replace
from functools import partial
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from animegamer.config.compose import compose_config
from animegamer.contracts.states import CHARACTER_STATES
from animegamer.game.cli import main
from animegamer.game.models import GameModels, load_game_models, read_level_flow
from animegamer.game.scheduler import play_game
from animegamer.game.state import INITIAL_STATE, update_states
from animegamer.game.turns import Game
from animegamer.mllm.predict import Prediction
from animegamer.mllm.sequence import parse_states
from animegamer.models.encoder import representation_tokens
from page_helpers import broken_links, image_pixels, read_page

HEIGHT, WIDTH, FRAMES = 32, 48, 17  # the tiny VAE compresses 4x in space: 8 x 12 latents
SMALL = ["model=tiny", f"pipeline.clips.height={HEIGHT}", f"pipeline.clips.width={WIDTH}"]
LEVEL_FLOW = {1: 0.25, 2: 1.5, 3: 4.0, 4: 12.0, 5: 30.0}

# A script long enough to push states into both clamps: SC climbs to 100, ST falls to 0.
SCRIPT = [
    {"ML": 1, "SC": 5, "ET": 0, "ST": -5},
    {"ML": 3, "SC": 5, "ET": 1, "ST": -5},
    {"ML": 5, "SC": 3, "ET": -2, "ST": 1},
    {"ML": 2, "SC": -1, "ET": 0, "ST": -4},
    {"ML": 4, "SC": 2, "ET": 5, "ST": -5},
]


def tiny_cfg(*overrides: str):
    return OmegaConf.to_object(compose_config("train", [*SMALL, *overrides]))


class StubPredict:
    """predict_next's signature; fixed states per call, a random rep, and a log of what it was given."""

    def __init__(self, cfg, script=SCRIPT, fail_at: int | None = None):
        self.n = representation_tokens(cfg.model.encoder)
        self.d = cfg.model.encoder.width
        self.script, self.fail_at = script, fail_at
        self.calls: list[dict] = []
        self.reps: list[torch.Tensor] = []

    def __call__(self, model, tokenizer, ids, history, instruction, window_turns):
        index = len(self.calls)
        self.calls.append({"history": list(history), "instruction": instruction, "window_turns": window_turns})
        if index == self.fail_at:
            parse_states(ids, [ids.turn_start] * 12)  # a malformed generation: raises ValueError
        states = self.script[index % len(self.script)]
        rep = torch.randn(self.n, self.d, generator=torch.Generator().manual_seed(100 + index))
        self.reps.append(rep)
        tokens = [ids.strength(states["ML"]), ids.ml_end]  # not checked by the loop, recorded as is
        return Prediction(dict(states), rep, tokens)


@pytest.fixture(scope="module")
def models():
    from animegamer.models.frozen_encoders import build_frozen_encoders
    from animegamer.models.game_mllm import game_tokenizer
    from animegamer.models.reconstruction import ReconstructionModel

    cfg = tiny_cfg()
    renderer = ReconstructionModel(cfg).eval().requires_grad_(False)
    vae = build_frozen_encoders(cfg.model.encoders, which=("vae",)).vae
    tokenizer, ids = game_tokenizer(cfg)
    mllm = SimpleNamespace(model=None, tokenizer=tokenizer, ids=ids)
    return GameModels(mllm, renderer, vae, LEVEL_FLOW, cfg)


def instructions(count: int) -> list[str]:
    return [f"Character: Qiqi; Motion: move {i}; Background: town at hour {i}." for i in range(count)]


def decode_mp4(path) -> np.ndarray:
    import av

    with av.open(str(path)) as container:
        return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])


# --------------------------------------------------------------------------- pure parts
def test_update_states_clamps():
    assert update_states({"SC": 50, "ET": 50, "ST": 50}, {"ML": 3, "SC": 2, "ET": -1, "ST": 0}) == \
        {"SC": 60, "ET": 45, "ST": 50}
    assert update_states({"SC": 98, "ET": 3, "ST": 50}, {"ML": 1, "SC": 5, "ET": -5, "ST": 5}) == \
        {"SC": 100, "ET": 0, "ST": 75}


def test_level_flow_needs_every_level(tmp_path):
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps({"motion_bins": {"level_flow": {str(k): v for k, v in LEVEL_FLOW.items()}}}))
    assert read_level_flow(tmp_path) == LEVEL_FLOW == read_level_flow(manifest)
    with pytest.raises(ValueError, match="lacks motion levels"):
        GameModels(None, None, None, {1: 0.1, 2: 0.2}, None)


# --------------------------------------------------------------------------- the loop
@pytest.fixture(scope="module")
def played(models, tmp_path_factory):
    """A 5-turn game with a window of 3 turns; the decoder's flow inputs are recorded."""
    out = tmp_path_factory.mktemp("game")
    stub = StubPredict(models.cfg)
    flows: list[list[float]] = []
    hook = models.renderer.decoder.register_forward_pre_hook(lambda m, args: flows.append(args[3].tolist()))
    try:
        record = play_game(models, instructions(len(SCRIPT)), out, seed=3, window_turns=3, predict_fn=stub)
    finally:
        hook.remove()
    return SimpleNamespace(out=out, stub=stub, flows=flows, record=record)


def test_game_writes_one_clip_per_turn(played):
    turns = played.record["turns"]
    assert len(turns) == len(SCRIPT)
    for i, turn in enumerate(turns):
        path = played.out / f"turn_{i:03d}.mp4"
        assert turn["video"] == path.name and path.exists()
        assert decode_mp4(path).shape == (FRAMES, HEIGHT, WIDTH, 3)
    assert sorted(p.name for p in played.out.glob("turn_*.mp4")) == [f"turn_{i:03d}.mp4" for i in range(len(SCRIPT))]


def test_state_log_is_consistent(played):
    record = json.loads((played.out / "game.json").read_text())
    assert record == json.loads(json.dumps(played.record))
    assert record["initial_states"] == {k: INITIAL_STATE for k in CHARACTER_STATES}
    states, clamped = {k: INITIAL_STATE for k in CHARACTER_STATES}, set()
    for turn, script in zip(record["turns"], SCRIPT):
        assert turn["predicted"] == script
        assert turn["states_before"] == states
        raw = {k: states[k] + 5 * script[k] for k in CHARACTER_STATES}
        clamped |= {("high" if v > 100 else "low") for v in raw.values() if not 0 <= v <= 100}
        states = {k: min(100, max(0, v)) for k, v in raw.items()}
        assert turn["states_after"] == states
        assert set(turn["timings"]) >= {"mllm", "sample", "vae_decode", "total", "encode_mp4"}
    assert record["states"] == states == {"SC": 100, "ET": 70, "ST": 0}
    assert clamped == {"high", "low"}  # the script drives states through both ends


def test_motion_level_picks_the_flow(played):
    steps = played.record["sampling"]["steps"]
    assert steps == 4
    assert (played.record["sampling"]["cache"], played.record["sampling"]["cache_threshold"]) == ("none", 0.05)
    assert len(played.flows) == steps * len(SCRIPT)
    for i, (turn, script) in enumerate(zip(played.record["turns"], SCRIPT)):
        assert turn["motion_level"] == script["ML"] and turn["flow"] == LEVEL_FLOW[script["ML"]]
        for call in played.flows[i * steps:(i + 1) * steps]:  # both CFG branches get the level's flow
            assert call == pytest.approx([LEVEL_FLOW[script["ML"]]] * 2)


def test_sliding_window(played):
    calls, reps = played.stub.calls, played.stub.reps
    names = instructions(len(SCRIPT))
    for i, call in enumerate(calls):
        history = call["history"]
        assert call["window_turns"] == 3 and call["instruction"] == names[i]
        assert len(history) == min(i, 2)  # never more than window_turns - 1, the most recent ones, in order
        first = i - len(history)
        assert [h.turn.instruction for h in history] == names[first:i]
        assert [dict(h.turn.states) for h in history] == SCRIPT[first:i]
        for h, rep in zip(history, reps[first:i]):
            assert torch.equal(h.rep, rep)


def test_index_html_shows_every_clip_with_its_first_frame_and_state_bars(played, tmp_path):
    """The storyboard, moved elsewhere, still finds every clip and poster; each poster is the clip's
    first frame; each turn card has one bar per state at the value game.json records."""
    moved = tmp_path / "moved"
    shutil.copytree(played.out, moved)
    page = moved / "index.html"
    assert broken_links(page) == []
    cards = [c for c in read_page(page).cards if c.videos]
    assert [c.videos[0]["src"] for c in cards] == [f"turn_{i:03d}.mp4" for i in range(len(SCRIPT))]
    for card, turn in zip(cards, played.record["turns"]):
        assert card.videos[0]["poster"] == f"turn_{turn['index']:03d}.jpg"
        poster = image_pixels(moved / card.videos[0]["poster"]).astype(np.float64)
        first = decode_mp4(moved / card.videos[0]["src"])[0].astype(np.float64)
        assert poster.shape == first.shape and np.corrcoef(poster.ravel(), first.ravel())[0, 1] > 0.8
        widths = [int(re.search(r"width: (\d+)%", bar).group(1)) for bar in card.bars]
        assert widths == [turn["states_after"][k] for k in CHARACTER_STATES]
    assert "Qiqi" in page.read_text() and {0, 100} <= {int(w) for w in re.findall(r"width: (\d+)%", page.read_text())}


def test_turns_are_seeded(models, tmp_path):
    """Same seed and predictions -> same frames; another seed -> other frames."""
    def first_frames(seed):
        game = Game(models, seed=seed, predict_fn=StubPredict(models.cfg))
        return game.play_turn("Character: Qiqi; Motion: run; Background: park.").frames

    a, b, c = first_frames(1), first_frames(1), first_frames(2)
    assert a.dtype == np.uint8 and a.shape == (FRAMES, HEIGHT, WIDTH, 3)
    assert np.array_equal(a, b) and not np.array_equal(a, c)


def test_default_window_is_k(models):
    game = Game(models, predict_fn=StubPredict(models.cfg))
    assert game.window_turns == len(models.cfg.data.window_weights) == 5


def test_malformed_generation_names_the_turn(models, tmp_path):
    stub = StubPredict(models.cfg, fail_at=2)
    with pytest.raises(ValueError, match=r"turn 2 .*malformed state generation"):
        play_game(models, instructions(4), tmp_path, predict_fn=stub)
    record = json.loads((tmp_path / "game.json").read_text())
    assert len(record["turns"]) == 2 and "turn 2" in record["error"]
    assert sorted(p.name for p in tmp_path.glob("turn_*.mp4")) == ["turn_000.mp4", "turn_001.mp4"]
    with pytest.raises(FileExistsError):
        play_game(models, instructions(1), tmp_path, predict_fn=StubPredict(models.cfg))


def test_failed_turn_leaves_the_game_unchanged(models):
    game = Game(models, predict_fn=StubPredict(models.cfg, fail_at=1))
    game.play_turn("Character: Qiqi; Motion: walk; Background: street.")
    before = (game.states, len(game.history))
    with pytest.raises(ValueError, match="turn 1"):
        game.play_turn("Character: Qiqi; Motion: jump; Background: street.")
    assert (game.states, len(game.history)) == before


def test_real_mllm_turn_plays_or_names_the_turn(models):
    """The real predict_next on an untrained tiny MLLM: either valid states or a ValueError for turn 0."""
    from animegamer.phases.phase_b import PhaseB

    mllm = PhaseB(models.cfg).eval().requires_grad_(False)
    game = Game(replace(models, mllm=mllm))
    try:
        result = game.play_turn("Character: Qiqi; Motion: wave; Background: beach.")
    except ValueError as error:
        assert str(error).startswith("turn 0 ") and "malformed state generation" in str(error)
    else:
        assert result.frames.shape == (FRAMES, HEIGHT, WIDTH, 3) and len(game.history) == 1


# --------------------------------------------------------------------------- exports and the command line
@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    from animegamer.checkpoints.export import save_export
    from animegamer.models.reconstruction import ReconstructionModel
    from animegamer.phases.common import set_trainable
    from animegamer.phases.phase_a import stage_trainable
    from animegamer.phases.specs import A_JOINT as JOINT
    from animegamer.phases.phase_b import PhaseB

    cfg = tiny_cfg()
    root = tmp_path_factory.mktemp("exports")
    torch.manual_seed(0)
    mllm = PhaseB(cfg).model
    renderer = ReconstructionModel(cfg)
    renderer.decoder.add_lora()
    set_trainable(renderer, stage_trainable(renderer, JOINT))
    for module in (mllm, renderer):
        with torch.no_grad():
            for p in module.parameters():
                if p.requires_grad:
                    p.add_(torch.randn_like(p) * 0.01)
    save_export(root / "b", mllm, {"phase": "b"})
    save_export(root / "a", renderer, {"phase": "a_joint"})
    # A later decoder-only export (as a decoder adaptation would write) loaded over the first one.
    set_trainable(renderer, [f"decoder.{n}" for n in renderer.decoder.adaln_parameters()])
    with torch.no_grad():
        for p in renderer.parameters():
            if p.requires_grad:
                p.add_(1.0)
    save_export(root / "c", renderer, {"phase": "c"})
    set_trainable(renderer, stage_trainable(renderer, JOINT))
    manifest = root / "manifest.json"
    manifest.write_text(json.dumps({"kind": "clips", "motion_bins": {
        "edges": [0.5, 2.5, 10, 20], "level_flow": {str(k): v for k, v in LEVEL_FLOW.items()}}}))
    trained = {"mllm": {n: p.detach().clone() for n, p in mllm.named_parameters() if p.requires_grad},
               "renderer": {n: p.detach().clone() for n, p in renderer.named_parameters() if p.requires_grad}}
    return SimpleNamespace(cfg=cfg, root=root, manifest=manifest, trained=trained)


def test_load_game_models(exports):
    models = load_game_models(exports.cfg, exports.root / "b", [exports.root / "a", exports.root / "c"], LEVEL_FLOW,
                              device="cpu")
    assert models.renderer.decoder.has_lora
    params = dict(models.renderer.named_parameters())
    trained = exports.trained["renderer"]
    assert trained and all(torch.equal(params[k], v) for k, v in trained.items())
    for module in (models.mllm.model, models.renderer):
        assert not any(p.requires_grad for p in module.parameters()) and not module.training
    # The MLLM's LoRA is merged for play; it predicts what the unmerged model with the export predicts.
    from animegamer.checkpoints.export import load_export
    from animegamer.mllm.predict import HistoryTurn, generate, prompt_batch
    from animegamer.mllm.sequence import Turn
    from animegamer.phases.phase_b import PhaseB

    assert not models.mllm.model.has_lora
    unmerged = PhaseB(exports.cfg)
    load_export(exports.root / "b", unmerged.model)
    unmerged.eval()
    history = [HistoryTurn(Turn("Character: Qiqi; Motion: slowly walk; Background: day town.",
                                {"ML": 2, "SC": 0, "ET": 1, "ST": 1}), torch.randn(46, 32, generator=torch.Generator().manual_seed(0)))]
    reps = [generate(m.model, m.ids, prompt_batch(m.model, m.tokenizer, m.ids, history, "Character: Qiqi; Motion: run.", 5))
            for m in (models.mllm, unmerged)]
    assert reps[0][0] == reps[1][0]
    torch.testing.assert_close(reps[0][1], reps[1][1], rtol=1e-4, atol=1e-5)
    assert models.vae.latent_shape(FRAMES, HEIGHT, WIDTH) == (5, 4, HEIGHT // 4, WIDTH // 4)
    assert models.level_flow == LEVEL_FLOW and models.sources["renderer"] == [str(exports.root / n) for n in "ac"]
    with pytest.raises(FileNotFoundError):
        load_game_models(exports.cfg, exports.root / "b", exports.root / "missing", LEVEL_FLOW, device="cpu")


def test_load_phase_c_export(exports, tmp_path):
    """A phase (c) export stands alone: encoder, decoder LoRA, AdaLN and motion scope in one folder."""
    from animegamer.phases.phase_c import PhaseC, export_phase_c

    module = PhaseC(exports.cfg)
    with torch.no_grad():
        for p in module.model.parameters():
            p.add_(0.01)
    export_phase_c(module, tmp_path / "c", {})
    models = load_game_models(exports.cfg, exports.root / "b", tmp_path / "c", LEVEL_FLOW, device="cpu")
    params = dict(models.renderer.named_parameters())
    wanted = {n: p for n, p in module.model.named_parameters() if p.requires_grad or n.startswith("encoder.")}
    assert models.renderer.decoder.has_lora and any(n.startswith("encoder.") for n in wanted)
    assert all(torch.equal(params[n], p) for n, p in wanted.items())


def test_phase_c_export_from_a_gathered_state_equals_the_modules(exports, tmp_path):
    """FSDP saves export from the tensors they gathered (the kept ones, unit by unit): the same files
    as reading the module, LoRA folder and the frozen encoder included; a partial state is refused."""
    from safetensors.torch import load_file

    from animegamer.phases.phase_c import PhaseC, export_phase_c
    from animegamer.training.fsdp_gather import saved_by

    module = PhaseC(exports.cfg)
    with torch.no_grad():
        for p in module.model.parameters():
            p.add_(0.01)
    keep = saved_by(module)
    state = {n.removeprefix("model."): p.detach().clone() for n, p in module.named_parameters() if keep(n, p)}
    export_phase_c(module, tmp_path / "module", {})
    export_phase_c(module, tmp_path / "state", {}, state=state)
    files = sorted(f.relative_to(tmp_path / "module") for f in (tmp_path / "module").rglob("*.safetensors"))
    assert [str(f) for f in files] == ["lora/adapter_model.safetensors", "trained.safetensors"]
    for name in files:
        expected, found = (load_file(str(tmp_path / side / name)) for side in ("module", "state"))
        assert found.keys() == expected.keys() and all(torch.equal(found[k], expected[k]) for k in expected)
    assert any(k.startswith("encoder.") for k in load_file(str(tmp_path / "state" / "trained.safetensors")))
    lora = next(n for n in state if "lora_B" in n)
    with pytest.raises(KeyError, match="lacks 1 tensors"):
        export_phase_c(module, tmp_path / "partial", {}, state={k: v for k, v in state.items() if k != lora})


def test_command_line(exports, tmp_path, monkeypatch, capfd):
    stub = StubPredict(exports.cfg)
    monkeypatch.setattr("animegamer.game.cli.play_game", partial(play_game, predict_fn=stub))  # main's games
    script = tmp_path / "instructions.txt"
    script.write_text("# a comment\n" + "\n".join(instructions(3)) + "\n\n")
    common = ["--mllm", str(exports.root / "b"), "--renderer", str(exports.root / "a"),
              "--clips-manifest", str(exports.manifest), "--device", "cpu", *SMALL]
    assert main([*common, "--instructions", str(script), "--out", str(tmp_path / "file"), "--seed", "5"]) == 0
    record = json.loads((tmp_path / "file" / "game.json").read_text())
    assert [t["instruction"] for t in record["turns"]] == instructions(3) and record["seed"] == 5
    assert len(list((tmp_path / "file").glob("turn_*.mp4"))) == 3

    # Interactive: an empty line ends the game; what follows it is never read as a turn.
    monkeypatch.setattr("sys.stdin", io.StringIO("\n".join(instructions(2)) + "\n\nnot played\n"))
    assert main([*common, "--interactive", "--out", str(tmp_path / "live")]) == 0
    record = json.loads((tmp_path / "live" / "game.json").read_text())
    assert [t["instruction"] for t in record["turns"]] == instructions(2)
    assert (tmp_path / "live" / "index.html").exists()

    # Interactive: a line the game could not play is refused with its reason, and the next one read instead.
    monkeypatch.setattr("sys.stdin", io.StringIO("\n".join([instructions(1)[0], "Wave <ML> hello.",
                                                              *instructions(2)[1:]]) + "\n\n"))
    assert main([*common, "--interactive", "--out", str(tmp_path / "typed")]) == 0
    record = json.loads((tmp_path / "typed" / "game.json").read_text())
    assert [t["instruction"] for t in record["turns"]] == instructions(2) and record["finished"]
    assert "typed: instruction 2 'Wave <ML> hello.': it contains reserved tokens" in capfd.readouterr().err

    # Interactive, ended before the first instruction: no game, and no folder left behind.
    for typed in ("", "\n"):
        monkeypatch.setattr("sys.stdin", io.StringIO(typed))
        assert main([*common, "--interactive", "--out", str(tmp_path / "none")]) == 0
        assert not (tmp_path / "none").exists()


# The shared log format (animegamer.utils.logging): "HH:MM:SS LEVEL [rankN] logger: message".
LOG_LINE = re.compile(r"^\d\d:\d\d:\d\d (DEBUG|INFO|WARNING|ERROR|CRITICAL) \[rank\d+\] [\w.]+: ")


def test_command_line_max_turns_limits_the_game_and_window_turns_sets_the_window(exports, tmp_path, monkeypatch,
                                                                                  capfd):
    """--max-turns is the number of turns played, --window-turns the MLLM's window; every line the
    command writes is a log line in the one shared format."""
    stub = StubPredict(exports.cfg)
    monkeypatch.setattr("animegamer.game.cli.play_game", partial(play_game, predict_fn=stub))  # main's games
    script = tmp_path / "instructions.txt"
    script.write_text("\n".join(instructions(5)) + "\n")
    common = ["--mllm", str(exports.root / "b"), "--renderer", str(exports.root / "a"),
              "--clips-manifest", str(exports.manifest), "--device", "cpu", *SMALL]
    capfd.readouterr()
    assert main([*common, "--instructions", str(script), "--out", str(tmp_path / "g"), "--max-turns", "3",
                 "--window-turns", "2"]) == 0
    record = json.loads((tmp_path / "g" / "game.json").read_text())
    assert [t["instruction"] for t in record["turns"]] == instructions(3)
    assert record["window_turns"] == 2 and record["turn_limit"] == 3
    assert [c["window_turns"] for c in stub.calls] == [2, 2, 2]
    assert [len(c["history"]) for c in stub.calls] == [0, 1, 1]  # window 2: one past turn at most
    lines = [line for line in capfd.readouterr().err.splitlines() if line.strip()]
    assert lines and [line for line in lines if not LOG_LINE.match(line)] == []
    assert any("playing the first 3 of 5 instructions" in line for line in lines)

    # Interactive: the limit stops the game before the next line is read.
    stub.calls.clear()
    monkeypatch.setattr("sys.stdin", io.StringIO("\n".join(instructions(4)) + "\n"))
    assert main([*common, "--interactive", "--out", str(tmp_path / "live"), "--max-turns", "2"]) == 0
    assert len(json.loads((tmp_path / "live" / "game.json").read_text())["turns"]) == 2 == len(stub.calls)
    assert stub.calls[0]["window_turns"] == len(exports.cfg.data.window_weights)  # default window: K


def test_command_line_user_errors_exit_with_a_message(exports, tmp_path, monkeypatch, capfd):
    """A folder that already holds a game, a missing export, a wrong override: exit code 2, the
    problem on stderr, no traceback."""
    from animegamer.errors import USER_ERROR_EXIT_CODE

    monkeypatch.setattr("animegamer.game.cli.play_game", partial(play_game, predict_fn=StubPredict(exports.cfg)))
    script = tmp_path / "instructions.txt"
    script.write_text(instructions(1)[0] + "\n")
    common = ["--clips-manifest", str(exports.manifest), "--device", "cpu", "--instructions", str(script), *SMALL]
    exports_ok = ["--mllm", str(exports.root / "b"), "--renderer", str(exports.root / "a")]
    assert main([*common, *exports_ok, "--out", str(tmp_path / "g")]) == 0
    cases = {
        "already holds a game": [*common, *exports_ok, "--out", str(tmp_path / "g")],
        f"--renderer {tmp_path / 'nowhere'}: not an export folder": [
            *common, "--mllm", str(exports.root / "b"), "--renderer", str(tmp_path / "nowhere"),
            "--out", str(tmp_path / "h")],
        "has no key 'no_such_key'": [*common, *exports_ok, "--out", str(tmp_path / "i"), "no_such_key=1"],
        # the two exports swapped: each named by its phase, before anything is loaded
        "is a phase b export, which holds no decoder; --renderer wants a renderer": [
            *common, "--mllm", str(exports.root / "a"), "--renderer", str(exports.root / "b"),
            "--out", str(tmp_path / "j")],
    }
    for message, argv in cases.items():
        capfd.readouterr()
        with pytest.raises(SystemExit) as stopped:
            main(argv)
        err = capfd.readouterr().err
        assert stopped.value.code == USER_ERROR_EXIT_CODE and message in err and "Traceback" not in err, err
    assert not any((tmp_path / name).exists() for name in "hij")


def test_storyboard_meta_says_how_many_earlier_turns_each_turn_reads():
    from animegamer.game.html import page_meta

    record = {"turns": [{}], "seed": 3, "window_turns": 5, "turn_limit": 1}
    assert page_meta(record)[:4] == ["1 turn", "seed 3", "each turn reads up to 4 earlier turns", "limit 1 turn"]
    assert "each turn reads up to 1 earlier turn" in page_meta({**record, "window_turns": 2})
    assert "each turn reads no earlier turn" in page_meta({**record, "window_turns": 1})


def test_a_malformed_generation_stops_the_command_naming_the_way_on(exports, tmp_path, monkeypatch, capfd):
    """Free decoding by a briefly trained MLLM stops the game with exit code 1; the message names
    --constrained-states (unless the game already used it) and a longer phase (b)."""
    def malformed(*args, **kwargs):
        raise ValueError("turn 0 ('Qiqi runs'): malformed state generation (token 10 is not </ST>): '...'")

    monkeypatch.setattr("animegamer.game.cli.play_game", malformed)
    script = tmp_path / "instructions.txt"
    script.write_text(instructions(1)[0] + "\n")
    common = ["--mllm", str(exports.root / "b"), "--renderer", str(exports.root / "a"), "--instructions", str(script),
              "--clips-manifest", str(exports.manifest), "--device", "cpu", *SMALL]
    for constrained, out in ((False, "free"), (True, "constrained")):
        capfd.readouterr()
        assert main([*common, "--out", str(tmp_path / out), *(["--constrained-states"] if constrained else [])]) == 1
        err = capfd.readouterr().err
        assert "game stopped: turn 0 ('Qiqi runs'): malformed state generation" in err
        assert ("plays through with --constrained-states" in err) != constrained
