"""Bad configurations fail in validation, before any model is built, with every problem listed.

One test per fault: sizes that disagree between encoder, decoder, MLLM, weights
folders, exports and data; token counts that do not match the tokenizer; missing weight folders;
trainer strategies that cannot produce the phase's export; samples made from data the pipeline has
remade since. Each checks the message.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import SHARED
from omegaconf import OmegaConf, open_dict
from phase_a_helpers import write_synthetic_features
from phase_b_helpers import write_synthetic_sessions

from animegamer.evaluation.preflight import validate_eval_run
from animegamer.phases.preflight import validate_train_run
from data_pipeline.config_checks import validate_pipeline_run
from animegamer.config.compose import OverrideError, compose_config
from animegamer.config.validate import ConfigError

OFFICIAL_TOKENIZER = SHARED / "reference" / "animegamer_tokenizer"


@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> Path:
    """Feature shards (phase a), session shards (phase b) and an empty adaptation set (phase c)."""
    root = tmp_path_factory.mktemp("faults_data")
    write_synthetic_features(root, compose_config("train", ["model=tiny"]).model.encoders, clips=4)
    write_synthetic_sessions(root, sessions=2)
    (root / "adaptation").mkdir()
    (root / "adaptation" / "manifest.json").write_text(json.dumps({"kind": "adaptation", "shards": []}))
    return root


def train_cfg(data_root: Path, phase: str, *overrides: str):
    trainer = [] if any(o.startswith("trainer=") for o in overrides) else ["trainer=cpu"]
    return compose_config("train", ["model=tiny", f"phase={phase}", *trainer, "logger=csv",
                                    f"data.root={data_root}", *overrides])


def problems_of(validate, cfg) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        validate(cfg)
    return caught.value.problems


def only_problem(validate, cfg) -> str:
    problems = problems_of(validate, cfg)
    assert len(problems) == 1, problems
    return problems[0]


def reported(validate, cfg) -> list[str]:
    """The problems ``validate`` reports for ``cfg``: [] when it accepts the config."""
    try:
        validate(cfg)
    except ConfigError as error:
        return error.problems
    return []


SHARDS_OF_PHASE = {"a_warmup": "features", "a_joint": "features", "b": "session_shards", "c": "adaptation"}
STRATEGY_OF_PRESET = {"gpu": "auto", "ddp": "ddp", "deepspeed_zero2": "deepspeed_stage_2",
                      "deepspeed_zero2_offload": "deepspeed_stage_2_offload", "fsdp": "fsdp"}


@pytest.mark.parametrize("phase", ["a_warmup", "a_joint", "b", "c"])
def test_tiny_configs_of_every_phase_are_valid(data_root, tmp_path, phase):
    assert reported(validate_train_run, train_cfg(data_root, phase)) == []
    # The pass reads this phase's own shards: over an empty folder it names exactly that shard folder.
    text = only_problem(validate_train_run, train_cfg(tmp_path, phase))
    assert text.startswith(f"{tmp_path / SHARDS_OF_PHASE[phase] / 'manifest.json'}: missing"), text


@pytest.mark.parametrize("override, message", [
    ("checkpoint.every_n_steps=-3", "checkpoint.every_n_steps=-3 must be >= 1"),
    ("checkpoint.every_n_steps=0", "checkpoint.every_n_steps=0 must be >= 1"),
    ("checkpoint.keep_last=-2", "checkpoint.keep_last=-2 must be -1 (keep all), 0 (no periodic saves) or a count"),
])
def test_checkpoint_settings_out_of_range_are_refused(data_root, override, message):
    assert only_problem(validate_train_run, train_cfg(data_root, "a_joint", override)).startswith(message)


# --------------------------------------------------------------------------- sizes
def test_encoder_width_must_match_the_decoder(data_root):
    text = only_problem(validate_train_run, train_cfg(data_root, "a_joint", "model.encoder.width=48"))
    assert "model.encoder.width=48 != decoder hidden 2x16=32" in text


def test_mllm_queries_must_fit_the_frame_tokens(data_root):
    cfg = train_cfg(data_root, "b", "model.encoder.text_tokens=300", "model.encoders.t5.max_tokens=300")
    problems = problems_of(validate_train_run, cfg)
    assert any("316 representation tokens but the layout has only 256 <frame_i> tokens" in p for p in problems)


def test_session_data_must_match_the_mllm_queries(data_root):
    # The sessions hold 46 = 30 + 16 tokens per turn; fusion=add gives N = 16 image tokens.
    text = only_problem(validate_train_run, train_cfg(data_root, "b", "model.encoder.fusion=add"))
    assert "reps.npy has shape (5, 46, 32) but this config's model needs (*, 16, 32)" in text


def test_feature_data_must_match_the_encoder(data_root):
    cfg = train_cfg(data_root, "a_warmup", "model.encoder.text_dim=64", "model.encoders.t5.d_model=64")
    text = only_problem(validate_train_run, cfg)
    assert "text.npy has shape (30, 32) but this config's model needs (30, 64)" in text


def test_weights_folder_must_match_the_configured_sizes(data_root, tmp_path):
    from animegamer.mllm.tokens import byte_tokenizer

    folder = tmp_path / "mistral"
    byte_tokenizer().save_pretrained(folder)
    (folder / "config.json").write_text(json.dumps({"hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 600}))
    text = only_problem(validate_train_run, train_cfg(data_root, "b", f"model.mllm.path={folder}"))
    assert "model.mllm.path=" in text and "hidden_size 64 (folder) vs 32 (config)" in text


def test_init_from_export_must_have_this_configs_sizes(data_root, tmp_path):
    export = tmp_path / "warmup_export"
    export.mkdir()
    (export / "trained.safetensors").write_bytes(b"")
    saved = OmegaConf.to_container(train_cfg(data_root, "a_warmup", "model.encoder.width=48",
                                             "model.decoder.attention_head_dim=24").model, resolve=True)
    (export / "export.json").write_text(json.dumps({"phase": "a_warmup", "config": {"model": saved}}))
    text = only_problem(validate_train_run, train_cfg(data_root, "a_joint", f"phase.init_from={export}"))
    assert "phase.init_from=" in text and "was trained at other sizes" in text
    assert "model.encoder.width 48 (export) vs 32 (this config)" in text
    assert "model.decoder.attention_head_dim 24 (export) vs 16 (this config)" in text


# --------------------------------------------------------------------------- tokens
def test_tokenizer_with_part_of_the_animegamer_tokens_is_refused(data_root, tmp_path):
    from animegamer.mllm.tokens import FRAME_TOKENS, byte_tokenizer

    tokenizer = byte_tokenizer()
    tokenizer.add_tokens(list(FRAME_TOKENS[:10]), special_tokens=True)
    tokenizer.save_pretrained(tmp_path / "tok")
    text = only_problem(validate_train_run, train_cfg(data_root, "b", f"model.mllm.tokenizer={tmp_path / 'tok'}"))
    assert "has 10 of the 284 AnimeGamer tokens" in text and "<frame_00010>" in text


def test_export_vocabulary_must_match_the_tokenizer(data_root, tmp_path):
    export = tmp_path / "b_export"
    (export / "adapter").mkdir(parents=True)
    (export / "trained.safetensors").write_bytes(b"")
    # The byte tokenizer has 3 + 256 tokens, + 284 AnimeGamer tokens = 543; 46 queries of width 32.
    (export / "adapter" / "mllm_meta.json").write_text(json.dumps(
        {"vocab_size": 32284, "num_query_tokens": 46, "rep_width": 32, "hidden_size": 32}))
    text = only_problem(validate_train_run, train_cfg(data_root, "b", f"phase.init_from={export}"))
    assert "phase.init_from=" in text and "vocab_size 32284 (export) vs 543 (this config)" in text


@pytest.mark.skipif(not OFFICIAL_TOKENIZER.is_dir(), reason="needs ../shared/reference/animegamer_tokenizer")
def test_official_tokenizer_against_an_llm_with_fewer_rows(data_root, tmp_path):
    official = tmp_path / "official.bin"
    official.write_bytes(b"")
    ok = train_cfg(data_root, "b", f"model.mllm.tokenizer={OFFICIAL_TOKENIZER}",
                   f"model.mllm.official_checkpoint={official}")
    assert reported(validate_train_run, ok) == []  # all 284 tokens, consecutive official ids: fits the checkpoint
    folder = tmp_path / "small_llm"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"hidden_size": 32, "vocab_size": 1000}))
    text = only_problem(validate_train_run, train_cfg(data_root, "b", f"model.mllm.tokenizer={OFFICIAL_TOKENIZER}",
                                                      f"model.mllm.path={folder}"))
    assert "has 1000 embedding rows but the tokenizer" in text and "has 32000 tokens before the AnimeGamer" in text


# --------------------------------------------------------------------------- missing folders
@pytest.mark.parametrize("phase,key", [
    ("b", "model.mllm.path"), ("b", "model.mllm.tokenizer"), ("b", "model.mllm.official_checkpoint"),
    ("a_joint", "model.decoder.path"), ("a_joint", "model.decoder.official_checkpoint"),
    ("a_joint", "phase.init_from"), ("a_joint", "model.encoders.vae.path"),
])
def test_missing_weight_folder_is_named(data_root, tmp_path, phase, key):
    missing = tmp_path / "nowhere"
    text = only_problem(validate_train_run, train_cfg(data_root, phase, f"{key}={missing}"))
    assert text.startswith(f"{key}='{missing}'") and ("no such" in text)


def test_missing_eval_exports_and_weights_are_listed(tmp_path):
    cfg = compose_config("evaluate", ["model=tiny", f"data.root={tmp_path}", f"model.mllm.path={tmp_path / 'llm'}",
                                      f"evaluation.mllm_export={tmp_path / 'b'}"])
    text = "\n".join(problems_of(validate_eval_run, cfg))
    for needle in ("evaluation.mllm_export=", "evaluation.renderer_export=", "model.mllm.path=", "manifest.json"):
        assert needle in text, needle


def test_missing_pipeline_export_is_named(tmp_path):
    cfg = compose_config("pipeline", ["experiment=quickstart", f"pipeline.adaptation.export={tmp_path / 'b'}"])
    text = only_problem(validate_pipeline_run, cfg)
    assert "pipeline.adaptation.export=" in text and "not a phase (b) export folder" in text


# --------------------------------------------------------------------------- trainer strategies
def test_deepspeed_needs_a_gpu(data_root):
    text = only_problem(validate_train_run, train_cfg(data_root, "a_warmup", "trainer.strategy=deepspeed_stage_2"))
    assert "trainer.strategy='deepspeed_stage_2' needs trainer.accelerator=gpu" in text


def test_fsdp_on_cpu_is_refused(data_root):
    text = only_problem(validate_train_run, train_cfg(data_root, "a_warmup", "trainer.strategy=fsdp"))
    assert "trainer.strategy='fsdp' needs trainer.accelerator=gpu" in text


@pytest.mark.parametrize("phase", ["a_joint", "b", "c"])
@pytest.mark.parametrize("strategy", ["deepspeed_stage_3", "deepspeed_stage_3_offload"])
def test_zero3_is_refused_for_phases_that_export_a_lora_adapter(data_root, phase, strategy):
    cfg = train_cfg(data_root, phase, "trainer=deepspeed_zero3", f"trainer.strategy={strategy}")
    text = only_problem(validate_train_run, cfg)
    assert f"trainer.strategy='{strategy}' partitions the LoRA weights" in text and "peft LoRA adapter" in text
    assert "use deepspeed_stage_2" in text


def test_zero3_is_accepted_for_the_warmup_stage(data_root):
    """a_warmup exports no adapter; its export gathers the partitions (strategies.full_weights)."""
    assert reported(validate_train_run, train_cfg(data_root, "a_warmup", "trainer=deepspeed_zero3")) == []
    # The same preset for a_joint, which writes a LoRA adapter folder, is refused for exactly that.
    text = only_problem(validate_train_run, train_cfg(data_root, "a_joint", "trainer=deepspeed_zero3"))
    assert "partitions the LoRA weights" in text, text


def test_zero3_builds_on_the_cpu_not_in_lightnings_init_context(data_root):
    """Lightning refuses init_module(empty_init=False) under ZeRO-3 (NotImplementedError at model build):
    the accepted ZeRO-3 stage must not ask for it, while ZeRO-2 on a GPU still builds in the trainer's context."""
    import contextlib

    from animegamer.training.strategies import module_init

    class Trainer:
        def init_module(self, empty_init=None):
            raise NotImplementedError(f"init_module(empty_init={empty_init}) is refused under ZeRO-3")

    zero3 = train_cfg(data_root, "a_warmup", "trainer=deepspeed_zero3", "trainer.accelerator=gpu")
    assert module_init(zero3, Trainer()) is contextlib.nullcontext
    zero2 = train_cfg(data_root, "a_warmup", "trainer=deepspeed_zero2", "trainer.accelerator=gpu")
    with pytest.raises(NotImplementedError):
        module_init(zero2, Trainer())()


@pytest.mark.parametrize("preset", ["gpu", "ddp", "deepspeed_zero2", "deepspeed_zero2_offload", "fsdp"])
@pytest.mark.parametrize("phase", ["a_warmup", "b"])
def test_replicated_weight_presets_are_accepted(data_root, preset, phase):
    cfg = train_cfg(data_root, phase, f"trainer={preset}", "trainer.num_nodes=2")
    assert (cfg.trainer.strategy, cfg.trainer.num_nodes) == (STRATEGY_OF_PRESET[preset], 2)
    assert reported(validate_train_run, cfg) == []


def test_deepspeed_precision_is_checked(data_root):
    text = only_problem(validate_train_run, train_cfg(data_root, "b", "trainer=deepspeed_zero2",
                                                      "trainer.precision=64-true"))
    assert "trainer.precision='64-true' is not supported by trainer.strategy='deepspeed_stage_2'" in text


def test_unknown_strategy_lists_the_known_ones(data_root):
    text = only_problem(validate_train_run, train_cfg(data_root, "b", "trainer.strategy=deepspeed_stage_4"))
    assert "trainer.strategy='deepspeed_stage_4' is not a known strategy" in text
    assert "'deepspeed_stage_2_offload'" in text and "'fsdp'" in text and "'ddp'" in text


def test_devices_and_nodes_must_be_positive(data_root):
    problems = problems_of(validate_train_run, train_cfg(data_root, "a_warmup", "trainer.devices=0",
                                                         "trainer.num_nodes=0"))
    assert problems == ["trainer.devices=0 must be >= 1 (or -1: every visible device)",
                        "trainer.num_nodes=0 must be >= 1"]


def test_session_shards_made_from_other_sessions_are_refused(tmp_path):
    """The pipeline cut the films again (new sessions.json) but could not remake the session shards: phase (b)
    would train on the old sessions and split held-out clips by the new ones. Refused, naming the step."""
    from animegamer.data.lineage import MADE_FROM, digest

    root = tmp_path / "pipeline"
    write_synthetic_sessions(root, sessions=2)
    sessions = root / "sessions.json"
    sessions.write_text(json.dumps({"sessions": [["film-000001", "film-000002"]]}))
    manifest = root / "session_shards" / "manifest.json"
    made = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**made, MADE_FROM: {"sessions": digest(root, "sessions")}}))
    assert reported(validate_train_run, train_cfg(root, "b")) == []

    sessions.write_text(json.dumps({"sessions": [["film-000001", "film-000002"], ["film-000003"]]}))
    text = only_problem(validate_train_run, train_cfg(root, "b"))
    assert text == (f"data.root='{root}': {manifest} was made from other sessions than the current ones: run "
                    f"pipeline.steps=[session_shards] again")


def test_an_unknown_accelerator_is_refused_before_lightning_sees_it(data_root):
    text = only_problem(validate_train_run, train_cfg(data_root, "a_warmup", "trainer.accelerator=gpux"))
    assert text == "trainer.accelerator='gpux' is not one of ('cpu', 'gpu', 'cuda')"


def test_padding_multiple_and_mllm_attention_kernels_are_checked(data_root):
    problems = problems_of(validate_train_run, train_cfg(data_root, "b", "phase.pad_to_multiple=-8",
                                                         "model.mllm.attention_backends=[cudnn,fast]"))
    assert len(problems) == 2, problems
    assert any("phase.pad_to_multiple=-8: must be >= 0" in p for p in problems), problems
    assert any("model.mllm.attention_backends[]='fast'" in p and "'efficient'" in p for p in problems), problems
    text = only_problem(validate_train_run, train_cfg(data_root, "b", "model.mllm.attention=eager",
                                                      "model.mllm.attention_backends=[math]"))
    assert "orders SDPA's kernels, but model.mllm.attention='eager'" in text


def test_decoder_compile_mode_is_checked_and_cuda_graphs_stay_out_of_training(data_root):
    from animegamer.models.decoder import check_decoder_compile

    problems = problems_of(validate_train_run, train_cfg(data_root, "a_warmup", "model.decoder.compile_mode=fastest"))
    assert len(problems) == 2, problems  # not a mode, and no compile=true to apply it to
    assert any("model.decoder.compile_mode='fastest' is not one of" in p for p in problems), problems
    assert any("needs model.decoder.compile=true" in p for p in problems), problems
    graphs = train_cfg(data_root, "a_joint", "model.decoder.compile=true", "model.decoder.compile_mode=reduce-overhead")
    assert "records CUDA graphs, for sampling only" in only_problem(validate_train_run, graphs)
    assert check_decoder_compile(graphs.model.decoder, training=False) == []  # the game and evaluation may
    searched = train_cfg(data_root, "a_joint", "model.decoder.compile=true",
                         "model.decoder.compile_mode=max-autotune-no-cudagraphs")
    assert check_decoder_compile(searched.model.decoder, training=True) == []


# --------------------------------------------------------------------------- all at once
def test_every_problem_is_reported_together(data_root, tmp_path):
    cfg = train_cfg(data_root, "b", "model.encoder.fusion=add", f"model.mllm.path={tmp_path / 'missing'}",
                    "trainer.strategy=deepspeed_stage_3", "trainer.devices=0", "phase.lr_schedule=linear")
    problems = problems_of(validate_train_run, cfg)
    text = "\n".join(problems)
    for needle in ("phase.lr_schedule='linear'", "model.mllm.path=", "trainer.devices=0",
                   "needs trainer.accelerator=gpu", "partitions the LoRA weights", "reps.npy has shape"):
        assert needle in text, needle
    assert len(problems) == 6, problems
    assert str(len(problems)) + " configuration problem(s)" in str(ConfigError(problems))


def test_fsdp_sharding_is_checked(data_root):
    text = only_problem(validate_train_run, train_cfg(data_root, "b", "trainer=fsdp", "trainer.fsdp_sharding=SHARD_ALL"))
    assert "trainer.fsdp_sharding" in text and "SHARD_ALL" in text and "SHARD_GRAD_OP" in text


@pytest.mark.parametrize("sharding", ["FULL_SHARD", "SHARD_GRAD_OP"])
def test_fsdp_sharding_reaches_the_strategy(data_root, sharding):
    from torch.distributed.fsdp import ShardingStrategy

    from animegamer.phases.run import make_strategy

    cfg = train_cfg(data_root, "b", "trainer=fsdp", f"trainer.fsdp_sharding={sharding}")
    strategy = make_strategy(cfg)
    assert strategy.sharding_strategy == ShardingStrategy[sharding]
    assert strategy.kwargs["forward_prefetch"] is True


def test_fsdp_init_device_is_checked(data_root):
    text = only_problem(validate_train_run, train_cfg(data_root, "b", "trainer=fsdp", "trainer.accelerator=gpu",
                                                      "trainer.fsdp_init_device=cuda"))
    assert "trainer.fsdp_init_device='cuda' is not one of ('cpu', 'gpu')" in text
    text = only_problem(validate_train_run, train_cfg(data_root, "b", "trainer.fsdp_init_device=gpu"))
    assert "applies to trainer.strategy=fsdp only" in text


@pytest.mark.parametrize("overrides, where", [
    (["trainer=fsdp", "trainer.fsdp_init_device=gpu"], "root device"),  # built where the stub's root device is
    (["trainer=fsdp"], "init_module"),  # Lightning's FSDP way: its init_module context (CPU)
    (["trainer=deepspeed_zero2"], "init_module"),
    (["trainer=cpu"], "nowhere special"),
])
def test_networks_are_built_where_the_strategy_wants_them(data_root, overrides, where):
    import contextlib
    from types import SimpleNamespace

    import torch
    from torch import nn

    from animegamer.training.strategies import module_init

    used = []

    @contextlib.contextmanager
    def init_module(empty_init):
        used.append(("init_module", empty_init))
        yield

    precision = SimpleNamespace(tensor_init_context=lambda: used.append(("precision",)) or contextlib.nullcontext())
    trainer = SimpleNamespace(init_module=init_module,
                              strategy=SimpleNamespace(root_device=torch.device("meta"), precision_plugin=precision))
    cfg = train_cfg(data_root, "b", *overrides)
    with module_init(cfg, trainer)():
        layer = nn.Linear(2, 2)
    expected = {"root device": ("meta", [("precision",)]), "init_module": ("cpu", [("init_module", False)]),
                "nowhere special": ("cpu", [])}[where]
    assert (layer.weight.device.type, used) == expected


# --------------------------------------------------------------------------- the phase node
def test_a_setting_appended_to_another_phase_is_refused(data_root):
    """``+phase.pack_tokens`` (Hydra appends any key given with +) is refused at composition, naming phase (a)'s
    own keys; a config built otherwise with the key is still refused by the validation (it would be dropped unread)."""
    with pytest.raises(OverrideError) as caught:
        train_cfg(data_root, "a_joint", "+phase.pack_tokens=1024")
    text = str(caught.value)
    assert text.startswith("+phase.pack_tokens=1024: phase (PhaseAConfig) has no key 'pack_tokens'; its keys: name, ")
    assert "text_dropout" in text and "pad_to_multiple" not in text
    cfg = train_cfg(data_root, "a_joint")
    with open_dict(cfg):
        OmegaConf.update(cfg, "phase.pack_tokens", 1024, force_add=True)
    text = only_problem(validate_train_run, cfg)
    assert text.startswith("phase.pack_tokens is not a setting of phase a_joint (PhaseAConfig has name, ")


def test_renaming_the_phase_does_not_change_its_schema(data_root):
    text = only_problem(validate_train_run, train_cfg(data_root, "b", "phase.name=c"))
    assert text == ("phase.name='c' is configured by PhaseCConfig, but the phase node is a PhaseBConfig: choose the "
                    "phase with phase=c instead of overriding phase.name")


def test_an_unknown_phase_name_lists_the_phases(data_root):
    text = only_problem(validate_train_run, train_cfg(data_root, "a_joint", "phase.name=d"))
    assert text == "phase.name='d' is not one of ('a_base', 'a_warmup', 'a_joint', 'b', 'c')"


def test_an_evaluation_refuses_a_url_data_root_by_name():
    from animegamer.evaluation.preflight import check_evaluation

    cfg = compose_config("evaluate", ["model=tiny", "data.root=http://127.0.0.1:1/pipeline"])
    problems = check_evaluation(cfg)
    assert ("data.root='http://127.0.0.1:1/pipeline': an evaluation reads its clips and session shards from a local "
            "folder, not a URL; copy the pipeline output here and name that folder") in problems
    assert not any("http:/127" in p for p in problems)  # no URL read as a path
