"""Training the frozen VAE to reconstruct: the loss learns, the schedule, the settings check, and the saved
folder loads through the frozen-encoder loader with the same reconstruction and the measured scale."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from animegamer.config.schema import EncodersConfig, VAEConfig
from animegamer.models.frozen_encoders import build_frozen_encoders
from animegamer.models.vae_training import psnr, reconstruct, to_uint8, vae_input
from animegamer.toy_vae import (
    TRAINING_RECORD,
    Clips,
    ToyVAETraining,
    check_saved,
    lr_at,
    save_vae,
    train_vae,
)

TINY_VAE = VAEConfig(block_out_channels=[8, 16, 16], layers_per_block=1, latent_channels=4, norm_num_groups=4)
FRAMES, HEIGHT, WIDTH = 9, 16, 24


def _cartoon_clips(count: int, seed: int) -> Clips:
    """Flat two-colour clips with a moving edge: the kind of picture the toy films are made of."""
    g = torch.Generator().manual_seed(seed)
    clips = []
    for _ in range(count):
        top, bottom = torch.randint(0, 256, (2, 3), generator=g, dtype=torch.uint8)
        edge = int(torch.randint(4, WIDTH - 4 - FRAMES, (1,), generator=g))
        clip = torch.empty(FRAMES, HEIGHT, WIDTH, 3, dtype=torch.uint8)
        for t in range(FRAMES):
            clip[t, :, :] = top
            clip[t, :, edge + t:] = bottom
        clips.append(clip)
    return Clips(torch.stack(clips), [f"clip-{i}" for i in range(count)])


@pytest.fixture(autouse=True)
def one_thread():
    """One intra-op thread: on a busy shared 2-core CPU, two threads of these small convolutions ran
    7x slower than one (measured)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def test_pixels_map_like_the_frozen_vae() -> None:
    video = torch.randint(0, 256, (2, 5, 4, 8, 3), dtype=torch.uint8)
    x = vae_input(video)
    assert x.shape == (2, 3, 5, 4, 8) and x.min() >= -1 and x.max() <= 1
    assert torch.equal(to_uint8(x), video)  # the two maps invert each other on 8-bit pixels
    assert math.isinf(float(psnr(video, video)[0]))
    noisy = (video.int() + 1).clamp(max=255).to(torch.uint8)
    assert float(psnr(video, noisy).min()) >= 10 * math.log10(255**2)  # one level of error at most


def test_schedule_warms_up_then_decays_to_the_floor_by_steps_or_seconds() -> None:
    run = ToyVAETraining(steps=100, warmup_steps=10, lr=1e-3, min_lr_ratio=0.1)
    assert lr_at(0, run) == pytest.approx(1e-4)
    assert lr_at(9, run) == pytest.approx(1e-3)
    assert lr_at(10, run) == pytest.approx(1e-3)
    assert lr_at(55, run) == pytest.approx(0.55e-3)  # half-way: half-way between lr and the floor
    assert lr_at(100, run) == pytest.approx(1e-4)
    timed = ToyVAETraining(steps=100, warmup_steps=10, lr=1e-3, min_lr_ratio=0.1, max_seconds=20.0)
    assert lr_at(11, timed, elapsed=20.0) == pytest.approx(1e-4)
    assert lr_at(11, timed, elapsed=10.0) == pytest.approx(0.55e-3)


def test_bad_settings_are_all_named() -> None:
    with pytest.raises(ValueError) as error:
        ToyVAETraining(steps=-1, lr=0.0, crop_frames=5, val_fraction=1.0, l1_weight=0.0, mse_weight=0.0).validate()
    for words in ("steps", "lr must be > 0", "crop_frames must be 8k + 1", "val_fraction", "nothing would be"):
        assert words in str(error.value)
    clips = _cartoon_clips(2, 0)
    with pytest.raises(ValueError, match="crop_height must be a multiple of the VAE's spatial compression 4"):
        train_vae(TINY_VAE, clips, clips, ToyVAETraining(steps=1, crop_height=6))


def test_training_learns_and_the_saved_folder_is_the_frozen_vae(tmp_path: Path) -> None:
    torch.manual_seed(0)
    train, held_out = _cartoon_clips(24, seed=1), _cartoon_clips(6, seed=2)
    untrained = ToyVAETraining(steps=0)
    _, before = train_vae(TINY_VAE, train, held_out, untrained)
    run = ToyVAETraining(steps=120, batch_size=4, lr=1e-2, warmup_steps=5, eval_every=60, eval_clips=6)
    model, record = train_vae(TINY_VAE, train, held_out, run)
    assert [p["step"] for p in record["curve"]] == [60, 120]
    # Measured: 10.2 dB (random init) -> 12.0 dB after 60 steps at batch 4 and 12.5-12.9 dB after 120
    # (three training seeds, l1 only); a run that stopped learning stays at 10.2.
    assert record["held_out_psnr"] > before["held_out_psnr"] + 1.5, (before["held_out_psnr"], record)

    folder = save_vae(model, tmp_path / "vae", record)
    saved = json.loads((folder / TRAINING_RECORD).read_text())
    assert saved["scaling_factor"] == pytest.approx(1.0 / record["latent_std"])
    assert check_saved(folder, held_out, 4, "cpu") == pytest.approx(record["held_out_psnr"], abs=1e-3)

    encoders = build_frozen_encoders(EncodersConfig(vae=VAEConfig(path=str(folder))), which=("vae",))
    vae = encoders.vae
    assert vae.from_disk and vae.scaling_factor == pytest.approx(saved["scaling_factor"])
    latents = vae.encode(held_out.video)
    assert tuple(latents.shape) == (6, *vae.latent_shape(FRAMES, HEIGHT, WIDTH)) == (6, 3, 4, 4, 6)
    # Scaled latents of the training clips have unit spread, as the scaling factor promises.
    assert float(vae.encode(train.video).std()) == pytest.approx(1.0, abs=0.1)
    decoded = vae.decode(latents)
    assert tuple(decoded.shape) == (6, FRAMES, HEIGHT, WIDTH, 3)
    rounded = (decoded * 255).round().to(torch.uint8)
    # The same pixels as the trained model gives, up to float rounding through the scaling factor.
    assert int((rounded.int() - reconstruct(model.eval(), held_out.video).int()).abs().max()) <= 1


def _write_clips(root: Path, video: bytes = b"mp4 bytes", bins: dict | None = None, source: str = "") -> Path:
    """A one-clip shard set at ``root/clips`` as the pipeline writes it: the clip's metadata names its
    source film's path (``source``, default one inside ``root``)."""
    import io
    import tarfile

    from animegamer.contracts.files import MANIFEST

    (root / "clips").mkdir(parents=True, exist_ok=True)
    members = {"f-000000.mp4": video,
               "f-000000.json": json.dumps({"key": "f-000000", "source": source or f"{root}/f.mp4"}).encode()}
    with tarfile.open(root / "clips" / "shard-000000.tar", "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    manifest = {"shards": [{"name": "shard-000000.tar"}], "motion_bins": bins or {"edges": [1.0]},
                "config": {"output": str(root)}}
    (root / "clips" / MANIFEST).write_text(json.dumps(manifest))
    return root


def test_a_trained_folder_is_reused_from_moved_data_and_retrained_for_other_clips(tmp_path: Path, monkeypatch) -> None:
    """The clips are named by their content, not their folder: a VAE folder carried to another machine
    (the data at another path), or beside the same films cut again elsewhere, is reused; other clips are
    trained on."""
    import shutil

    import animegamer.toy_vae as toy_vae

    first = _write_clips(tmp_path / "machine_a" / "pipeline")
    run = ToyVAETraining(steps=1)
    trained = []
    monkeypatch.setattr(toy_vae, "train_and_save", lambda out, data, *a, **k: trained.append(str(data)) or {})
    identity = toy_vae._identity(first, TINY_VAE, 0, run)
    out = tmp_path / "vae"
    out.mkdir()
    (out / TRAINING_RECORD).write_text(json.dumps({**identity, "data": str(first), "held_out_psnr": 31.5}))

    moved = tmp_path / "machine_b" / "pipeline"
    shutil.copytree(first, moved)
    assert toy_vae.ensure_trained(out, moved, TINY_VAE, 0, run)["held_out_psnr"] == 31.5
    recut = _write_clips(tmp_path / "machine_c" / "pipeline")  # each clip names machine_c's film
    assert toy_vae.ensure_trained(out, recut, TINY_VAE, 0, run)["held_out_psnr"] == 31.5
    assert trained == []

    _write_clips(moved, video=b"other clips")
    toy_vae.ensure_trained(out, moved, TINY_VAE, 0, run)
    assert trained == [str(moved)]
    toy_vae.ensure_trained(out, first, TINY_VAE, 1, run)  # another random build of the encoder
    assert trained == [str(moved), str(first)]


def test_clip_content_digest_ignores_where_the_clips_were_cut(tmp_path: Path) -> None:
    """Two cuts of the same film in two folders differ only in each clip's source path: same digest."""
    from animegamer.data.trained_data import clip_content_sha256

    base = clip_content_sha256(_write_clips(tmp_path / "a"), "clips")
    assert base is not None and clip_content_sha256(_write_clips(tmp_path / "b"), "clips") == base
    assert clip_content_sha256(_write_clips(tmp_path / "c", video=b"other bytes"), "clips") != base
    assert clip_content_sha256(_write_clips(tmp_path / "d", bins={"edges": [2.0]}), "clips") != base
    assert clip_content_sha256(tmp_path / "none", "clips") is None
    (tmp_path / "a" / "clips" / "shard-000000.tar").unlink()
    assert clip_content_sha256(tmp_path / "a", "clips") is None  # a shard missing: nothing to name


# --------------------------------------------------------------------------- stages: --init
def _staged_run(steps: int) -> ToyVAETraining:
    """Settings of one short stage: a long warm-up keeps one step's change small, so the first evaluation
    after it still reads the weights the stage started from."""
    return ToyVAETraining(steps=steps, batch_size=4, lr=1e-2, warmup_steps=1000, eval_every=1, eval_clips=4,
                          eval_batch_size=4)


def test_stages_start_from_the_earlier_folder_and_record_the_chain(tmp_path: Path, monkeypatch) -> None:
    """A stage started with --init begins at the earlier stage's weights and held-out PSNR, not at a random
    build's, and draws the batches after the chain's so far; each stage's record names its init (weights
    digest, PSNR, and that folder's own init) and counts the chain's steps."""
    from safetensors.torch import load_file

    import animegamer.toy_vae as toy_vae

    train, held_out = _cartoon_clips(8, seed=1), _cartoon_clips(4, seed=2)
    monkeypatch.setattr(toy_vae, "load_clips", lambda data, val_fraction: (train, held_out))
    data = _write_clips(tmp_path / "pipeline")
    draws: list[int] = []
    step_generator = toy_vae.step_generator
    monkeypatch.setattr(toy_vae, "step_generator",
                        lambda seed, step, rank: draws.append(step) or step_generator(seed, step, rank))
    # The first stage starts from another random build (encoder seed 4) than the later ones (seed 0): the
    # two score 10.9 and 9.8 dB on these clips, so starting at the first stage's PSNR is told apart from
    # starting at a random build's without the seconds of training that would move it as far.
    first = toy_vae.train_and_save(tmp_path / "s1", data, TINY_VAE, 4, _staged_run(1))
    assert first["init"] is None and first["total_steps"] == first["steps_done"] == 1
    fresh = float(toy_vae.held_out_psnr(toy_vae.initial_vae(TINY_VAE, 0), held_out.video, 4,
                                        torch.device("cpu")).mean())
    assert abs(first["held_out_psnr"] - fresh) > 0.5, (first["held_out_psnr"], fresh)

    started = toy_vae.initial_vae(TINY_VAE, 0, tmp_path / "s1").state_dict()
    saved = load_file(toy_vae.weights_file(tmp_path / "s1"))
    assert started.keys() == saved.keys() and all(torch.equal(started[k], saved[k]) for k in saved)

    second = toy_vae.train_and_save(tmp_path / "s2", data, TINY_VAE, 0, _staged_run(2), init=tmp_path / "s1")
    assert second["curve"][0]["held_out_psnr"] == pytest.approx(first["held_out_psnr"], abs=0.05)
    assert second["init"] == {"weights_sha256": first["weights_sha256"], "held_out_psnr": first["held_out_psnr"],
                              "total_steps": 1, "init": None}
    assert (second["steps_done"], second["total_steps"]) == (2, 3)
    assert second["init_folder"] == str((tmp_path / "s1").resolve())

    assert draws == [0, 1, 2]  # the second stage's batches follow the first's, not repeat them
    third = toy_vae.train_and_save(tmp_path / "s3", data, TINY_VAE, 0, _staged_run(1), init=tmp_path / "s2")
    assert third["init"]["init"] == second["init"] and third["init"]["held_out_psnr"] == second["held_out_psnr"]
    assert (third["steps_done"], third["total_steps"]) == (1, 4) and draws == [0, 1, 2, 3]
    on_disk = json.loads((tmp_path / "s3" / TRAINING_RECORD).read_text())
    assert on_disk["init"] == third["init"] and on_disk["total_steps"] == 4


def _trained_folder(folder: Path, vae_cfg: VAEConfig = TINY_VAE, seed: int = 0, psnr_db: float = 20.0) -> Path:
    """A VAE folder as a stage leaves it: the weights and a record naming its VAE config."""
    from dataclasses import asdict

    from animegamer.models.vae_training import trainable_vae

    save_vae(trainable_vae(vae_cfg, seed), folder,
             {"scaling_factor": 1.0, "held_out_psnr": psnr_db, "steps_done": 5, "vae": asdict(vae_cfg)})
    return folder


def test_a_stage_is_reused_with_the_same_init_and_trained_again_with_another(tmp_path: Path, monkeypatch) -> None:
    import shutil

    import animegamer.toy_vae as toy_vae

    data = _write_clips(tmp_path / "pipeline")
    first, other = _trained_folder(tmp_path / "s1"), _trained_folder(tmp_path / "s1b", seed=1)
    trained = []
    monkeypatch.setattr(toy_vae, "train_and_save",
                        lambda out, data, vae_cfg, seed, run, about=None, init=None: trained.append(init) or {})
    run = ToyVAETraining(steps=1)
    out = tmp_path / "s2"
    out.mkdir()
    link = toy_vae.init_link(first, TINY_VAE, out)
    (out / TRAINING_RECORD).write_text(json.dumps({**toy_vae._identity(data, TINY_VAE, 0, run, link),
                                                   "held_out_psnr": 25.0}))

    assert toy_vae.ensure_trained(out, data, TINY_VAE, 0, run, init=first)["held_out_psnr"] == 25.0
    moved = tmp_path / "carried" / "s1"
    shutil.copytree(first, moved)  # the same weights in another folder: the same stage
    assert toy_vae.ensure_trained(out, data, TINY_VAE, 0, run, init=moved)["held_out_psnr"] == 25.0
    assert trained == []
    toy_vae.ensure_trained(out, data, TINY_VAE, 0, run, init=other)  # other weights
    toy_vae.ensure_trained(out, data, TINY_VAE, 0, run)  # no init: the random build
    assert trained == [other, None]
    _trained_folder(first, psnr_db=21.0)  # the same weights, another record of them
    toy_vae.ensure_trained(out, data, TINY_VAE, 0, run, init=first)
    assert trained == [other, None, first]


@pytest.fixture
def root_logging():
    """The root logger's handlers as they were: the command sets up its own, writing to this test's
    captured stderr, which is closed once the test ends."""
    import logging

    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.mark.parametrize("case", ["other config", "not trained", "no record", "weights changed", "itself"])
def test_an_init_folder_that_cannot_start_the_stage_is_refused_by_name(tmp_path: Path, capsys, root_logging,
                                                                      case: str) -> None:
    from animegamer.toy_vae import main

    data = _write_clips(tmp_path / "pipeline")
    out = tmp_path / "vae"
    init = tmp_path / "earlier"
    if case == "other config":
        _trained_folder(init, VAEConfig(block_out_channels=[8, 16, 16], layers_per_block=1, latent_channels=8,
                                        norm_num_groups=4))
        words = "trained with another VAE config (latent_channels: 8, here 4)"
    elif case == "not trained":
        init.mkdir()
        words = "not a trained VAE folder (no training.json or diffusion_pytorch_model.safetensors)"
    elif case == "no record":
        _trained_folder(init)
        (init / TRAINING_RECORD).write_text(json.dumps({"scaling_factor": 1.0}))
        words = "not a trained VAE folder (training.json has no held_out_psnr, vae)"
    elif case == "weights changed":
        from animegamer.toy_vae import weights_file

        _trained_folder(init)
        weights_file(init).write_bytes(weights_file(_trained_folder(tmp_path / "another", seed=1)).read_bytes())
        words = "diffusion_pytorch_model.safetensors is not the file its training.json records"
    else:
        init = _trained_folder(out)
        words = "that is the output folder itself"
    before = sorted(p.name for p in out.iterdir()) if out.exists() else None
    with pytest.raises(SystemExit) as exit_info:
        main([str(out), "--data", str(data), "--model", "tiny", "--steps", "1", "--init", str(init)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"error: --init {init}: {words}" in err and "Traceback" not in err
    assert (sorted(p.name for p in out.iterdir()) if out.exists() else None) == before  # nothing written


@pytest.mark.parametrize("args, words", [
    (["--device", "cuda"], "--device cuda needs a CUDA GPU, and torch sees none on this machine: run on the CPU "
                           "with --device cpu"),
    (["--device", "gpu"], "--device gpu: not a device torch knows"),
    (["--steps", "-3"], "steps must be >= 0, got -3"),
    ([], "no_pipeline: not a pipeline output folder (no clips/ in it)"),
])
def test_settings_and_a_device_this_machine_lacks_are_refused_before_the_clips_are_read(
        tmp_path: Path, capsys, monkeypatch, root_logging, args, words) -> None:
    from animegamer.toy_vae import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as exit_info:
        main([str(tmp_path / "vae"), "--data", str(tmp_path / "no_pipeline"), *args])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and words in err and "Traceback" not in err
    assert not (tmp_path / "vae").exists()
