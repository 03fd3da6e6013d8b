"""Caption-and-state backends: fields, parsing, jsonl import, retry loop, HTTP and a tiny real VLM."""
from __future__ import annotations

import base64
import hashlib
import io
import json
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from http_fakes import FakeChatServer, huge, no_proxy, redirect, silent, trickle  # noqa: F401 - no_proxy: autouse
from PIL import Image

from animegamer.config.schema import CaptionConfig
from animegamer.media.video import evenly_spaced_indices, pick_frames
from data_pipeline.captioners import fields
from data_pipeline.captioners.base import (
    BACKENDS,
    CaptionResult,
    Captioner,
    ClipContext,
)
from data_pipeline.captioners.fields import (
    Caption,
    States,
    build_instruction,
    build_motion_text,
    parse_caption_json,
)
from data_pipeline.captioners.http import build_http_captioner
from data_pipeline.captioners.jsonl import JsonlCaptioner
from data_pipeline.captioners.none import DISABLED_REASON
from data_pipeline.captioners.prompting import (
    IMAGE,
    PROMPT,
    REFERENCE_LABEL,
    CaptionRequest,
    GenerationError,
    PromptCaptioner,
    ReferenceImages,
    caption_with_retries,
    content_parts,
)
from data_pipeline.captioners.registry import build_captioner

GOOD_ANSWER = {
    "character": "Sosuke",
    "motion": "talk",
    "adverb": "softly",
    "environment": "seaside village",
    "time_of_day": "evening",
    "states": {"SC": 1, "ET": 0, "ST": -1},
}
GOOD_TEXT = json.dumps(GOOD_ANSWER)
FRAME_H, FRAME_W = 24, 32


def make_ctx(film_id: str = "ep01", start: float = 0.0, end: float = 2.0, num_frames: int = 9) -> ClipContext:
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, size=(num_frames, FRAME_H, FRAME_W, 3), dtype=np.uint8)
    return ClipContext(film_id=film_id, clip_key=f"{film_id}/{start:.2f}", start_s=start, end_s=end, frames=frames)


def record(film: str, start: float, end: float, character: str = "Sosuke", **overrides: Any) -> dict[str, Any]:
    data = {"film": film, "start": start, "end": end, **GOOD_ANSWER, "character": character}
    data.update(overrides)
    return data


def write_jsonl(path: Path, records: list[Any]) -> Path:
    lines = [r if isinstance(r, str) else json.dumps(r) for r in records]
    path.write_text("\n".join(lines) + "\n")
    return path


# --------------------------------------------------------------------------- fields and templates
def test_caption_validation_names_the_bad_field() -> None:
    caption = Caption.from_dict({**GOOD_ANSWER, "adverb": "  softly "})
    assert caption.adverb == "softly"
    with pytest.raises(ValueError, match="'motion'"):
        Caption.from_dict({**GOOD_ANSWER, "motion": "   "})
    with pytest.raises(ValueError, match="'environment'"):
        Caption.from_dict({k: v for k, v in GOOD_ANSWER.items() if k != "environment"})
    with pytest.raises(ValueError, match="'character'.*string"):
        Caption.from_dict({**GOOD_ANSWER, "character": 3})
    with pytest.raises(Exception):  # frozen
        caption.motion = "run"  # type: ignore[misc]


@pytest.mark.parametrize(
    "states, bad",
    [
        ({"SC": 2, "ET": 0, "ST": 1}, "SC"),
        ({"SC": 0, "ET": -1, "ST": 1}, "ET"),
        ({"SC": 0, "ET": 0, "ST": 0}, "ST"),
        ({"SC": True, "ET": 0, "ST": 1}, "SC"),
        ({"SC": 1.0, "ET": 0, "ST": 1}, "SC"),
        ({"SC": "1", "ET": 0, "ST": 1}, "SC"),
        ({"SC": 0, "ET": 0}, "ST"),
        ({"SC": 0, "ET": 0, "ST": 1, "XX": 1}, "XX"),
    ],
)
def test_states_validation(states: dict[str, Any], bad: str) -> None:
    with pytest.raises(ValueError, match=f"'{bad}'"):
        States.from_dict(states)


def test_states_accept_allowed_values() -> None:
    for sc in (0, 1):
        for st in (-1, 1):
            assert States.from_dict({"SC": sc, "ET": 1 - sc, "ST": st}).to_dict() == {"SC": sc, "ET": 1 - sc, "ST": st}


def test_templates() -> None:
    caption = Caption.from_dict(GOOD_ANSWER)
    assert build_instruction(caption) == "Character: Sosuke; Motion: softly talk; Background: evening seaside village."
    assert build_motion_text(caption) == "softly talk"
    assert fields.CAPTION_FIELDS == ("character", "motion", "adverb", "environment", "time_of_day")


# --------------------------------------------------------------------------- parsing model answers
@pytest.mark.parametrize(
    "text",
    [
        GOOD_TEXT,
        f"```json\n{GOOD_TEXT}\n```",
        f"Sure! Here is the annotation:\n{json.dumps(GOOD_ANSWER, indent=2)}\nHope this helps {{:}}",
        "```\n" + GOOD_TEXT + "\n```",
    ],
)
def test_parse_caption_json_accepts_wrapped_answers(text: str) -> None:
    caption, states = parse_caption_json(text)
    assert caption == Caption.from_dict(GOOD_ANSWER)
    assert states == States(SC=1, ET=0, ST=-1)


def test_parse_caption_json_braces_inside_strings() -> None:
    answer = {**GOOD_ANSWER, "environment": "a room with a {curly} sign \"}\""}
    caption, _ = parse_caption_json("prefix " + json.dumps(answer) + " suffix {}")
    assert caption.environment == answer["environment"]


@pytest.mark.parametrize(
    "text, match",
    [
        ("I cannot see the character.", "no JSON object"),
        ('{"character": "A", ', "unbalanced"),
        ("{'character': 'A'}", "invalid JSON"),
        (json.dumps({k: v for k, v in GOOD_ANSWER.items() if k != "adverb"}), "'adverb'"),
        (json.dumps({**GOOD_ANSWER, "mood": "happy"}), "'mood'"),
        (json.dumps({**GOOD_ANSWER, "motion": ["talk"]}), "'motion'"),
        (json.dumps({**GOOD_ANSWER, "states": {"SC": 1, "ET": 0, "ST": "+1"}}), "'ST'"),
        (json.dumps({**GOOD_ANSWER, "states": [1, 0, -1]}), "'states'"),
        (json.dumps({**GOOD_ANSWER, "time_of_day": ""}), "'time_of_day'"),
    ],
)
def test_parse_caption_json_rejects(text: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        parse_caption_json(text)


# --------------------------------------------------------------------------- base helpers
def test_evenly_spaced_indices() -> None:
    assert evenly_spaced_indices(17, 4) == [0, 5, 11, 16]
    assert evenly_spaced_indices(17, 1) == [8]
    assert evenly_spaced_indices(3, 10) == [0, 1, 2]
    frames = np.arange(10, dtype=np.uint8).reshape(10, 1, 1, 1).repeat(3, axis=-1)
    assert [int(f[0, 0, 0]) for f in pick_frames(frames, 3)] == [0, 4, 9]  # 4.5 rounds to even
    with pytest.raises(ValueError):
        evenly_spaced_indices(0, 2)


def test_clip_context_validates_frames() -> None:
    with pytest.raises(ValueError, match="uint8"):
        ClipContext("f", "k", 0.0, 1.0, np.zeros((2, 4, 4, 3), dtype=np.float32))
    with pytest.raises(ValueError, match="end_s"):
        ClipContext("f", "k", 2.0, 1.0, np.zeros((2, 4, 4, 3), dtype=np.uint8))
    assert make_ctx(start=2.0, end=4.0).midpoint_s == 3.0


def test_caption_result_json_and_invariants() -> None:
    ok = CaptionResult.success(Caption.from_dict(GOOD_ANSWER), States(1, 0, -1), "x", "v1", attempts=2)
    data = json.loads(json.dumps(ok.to_json()))
    assert data == {
        "status": "ok", "caption": {k: v for k, v in GOOD_ANSWER.items() if k != "states"},
        "states": GOOD_ANSWER["states"], "error": "", "captioner": "x", "captioner_version": "v1", "attempts": 2,
    }
    failed = CaptionResult.failure("boom", "x", "v1", attempts=3)
    assert failed.to_json()["caption"] is None and failed.to_json()["states"] is None and not failed.ok
    with pytest.raises(ValueError):
        CaptionResult("failed", "x", "v1", caption=Caption.from_dict(GOOD_ANSWER), error="e")


def test_build_captioner_unknown_backend_lists_choices() -> None:
    with pytest.raises(ValueError, match="jsonl.*vlm.*http.*none"):
        build_captioner(CaptionConfig(backend="magic"))
    with pytest.raises(ValueError, match="caption.path"):
        build_captioner(CaptionConfig(backend="jsonl", path=""))
    with pytest.raises(ValueError, match="caption.url"):
        build_captioner(CaptionConfig(backend="http", model_name="m"))
    with pytest.raises(ValueError, match="num_frames"):
        build_captioner(CaptionConfig(backend="none", num_frames=0))
    assert set(BACKENDS) == {"jsonl", "vlm", "http", "none"}


def test_none_backend() -> None:
    captioner = build_captioner(CaptionConfig(backend="none"))
    assert isinstance(captioner, Captioner) and not captioner.needs_frames
    result = captioner.caption(make_ctx())
    assert result.status == "failed" and result.error == DISABLED_REASON and result.caption is None


# --------------------------------------------------------------------------- jsonl import
def test_jsonl_midpoint_selection_and_overlaps(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "caps.jsonl",
        [record("ep01", 0.0, 10.0, "Long"), "", record("ep01", 5.0, 8.0, "Inner"), record("ep02", 0.0, 100.0, "Other")],
    )
    captioner = build_captioner(CaptionConfig(backend="jsonl", path=str(path)))
    assert isinstance(captioner, JsonlCaptioner) and not captioner.needs_frames
    assert captioner.version == hashlib.sha256(path.read_bytes()).hexdigest()[:12]

    def character(start: float, end: float) -> str:
        result = captioner.caption(make_ctx("ep01", start, end))
        assert result.status == "ok", result.error
        assert result.captioner == "jsonl" and result.captioner_version == captioner.version
        return result.caption.character

    assert character(0.0, 2.0) == "Long"  # midpoint 1
    assert character(4.0, 8.0) == "Inner"  # midpoint 6: both cover, the later start wins
    assert character(8.0, 10.0) == "Long"  # midpoint 9: Inner ended at 8 (half-open)
    assert captioner.caption(make_ctx("ep01", 0, 2)).states == States(1, 0, -1)

    uncovered = captioner.caption(make_ctx("ep01", 9.0, 11.0))  # midpoint 10.0 == end: not covered
    assert uncovered.status == "failed" and uncovered.caption is None
    assert uncovered.error.startswith("no caption record covers t=10.00s")
    assert captioner.caption(make_ctx("ep03", 0, 2)).status == "failed"


def test_jsonl_folder_reads_every_file_and_aliases(tmp_path: Path) -> None:
    folder = tmp_path / "captions"
    folder.mkdir()
    a = write_jsonl(folder / "a.jsonl", [record("ep01.mkv", 0.0, 5.0, "FromName")])
    b = write_jsonl(folder / "b.jsonl", [record("ep02", 0.0, 5.0, "FromStem")])
    (folder / "notes.txt").write_text("ignored")
    film_paths = {"f-001": "/films/ep01.mkv", "f-002": "/films/season/ep02.mp4"}
    captioner = build_captioner(CaptionConfig(backend="jsonl", path=str(folder)), film_paths)
    assert captioner.caption(make_ctx("f-001", 1, 2)).caption.character == "FromName"
    assert captioner.caption(make_ctx("f-002", 1, 2)).caption.character == "FromStem"
    assert captioner.version == hashlib.sha256(a.read_bytes() + b.read_bytes()).hexdigest()[:12]


@pytest.mark.parametrize(
    "bad_line, match",
    [
        ("{not json", "invalid JSON"),
        ('{"film": "ep01", "start": 0', r"invalid JSON: Expecting ',' delimiter \(column 28\)"),  # cut short
        (json.dumps(record("ep01", 3.0, 2.0)), "'end'"),
        (json.dumps(record("ep01", 0.0, 2.0, states={"SC": 1, "ET": 0, "ST": 0})), "'ST'"),
        (json.dumps({k: v for k, v in record("ep01", 0, 1).items() if k != "film"}), "'film'"),
        (json.dumps(record("ep01", 0.0, 2.0, note="x")), "'note'"),
        (json.dumps(record("ep01", "0", 2.0)), "'start'"),
    ],
)
def test_jsonl_bad_line_names_file_and_line(tmp_path: Path, bad_line: str, match: str) -> None:
    path = write_jsonl(tmp_path / "caps.jsonl", [record("ep01", 0, 1), "", bad_line])
    with pytest.raises(ValueError, match=match) as info:
        build_captioner(CaptionConfig(backend="jsonl", path=str(path)))
    assert f"{path}:3:" in str(info.value)


def test_jsonl_missing_inputs(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        build_captioner(CaptionConfig(backend="jsonl", path=str(tmp_path / "nope.jsonl")))
    with pytest.raises(FileNotFoundError, match="no \\*.jsonl"):
        build_captioner(CaptionConfig(backend="jsonl", path=str(tmp_path)))


# --------------------------------------------------------------------------- retry loop
class ScriptedGenerator:
    """Answers from a script; an Exception in the script is raised instead of answered."""

    def __init__(self, script: list[Any]) -> None:
        self.script = list(script)
        self.requests: list[CaptionRequest] = []

    def __call__(self, request: CaptionRequest) -> str:
        self.requests.append(request)
        item = self.script.pop(0)
        if isinstance(item, Exception):
            raise item
        return item


def a_request(num_frames: int = 2) -> CaptionRequest:
    return CaptionRequest(PROMPT, tuple(Image.new("RGB", (8, 8)) for _ in range(num_frames)))


def test_retry_loop_fails_twice_then_succeeds() -> None:
    generator = ScriptedGenerator(["no idea", '{"character": "A"}', f"```json\n{GOOD_TEXT}\n```"])
    result = caption_with_retries(generator, a_request(), retries=2, captioner="fake", version="1")
    assert result.status == "ok" and result.attempts == 3
    assert result.caption.motion == "talk" and result.states == States(1, 0, -1)
    assert generator.requests[0].prompt == PROMPT
    assert "no JSON object" in generator.requests[1].prompt  # the parse error is fed back
    assert "missing field" in generator.requests[2].prompt and "no JSON object" not in generator.requests[2].prompt


def test_retry_loop_never_parses_reports_last_error() -> None:
    generator = ScriptedGenerator(["a", "b", json.dumps({**GOOD_ANSWER, "adverb": 5})])
    result = caption_with_retries(generator, a_request(), retries=2, captioner="fake", version="1")
    assert result.status == "failed" and result.attempts == 3 and result.caption is None and result.states is None
    assert result.error.startswith("attempt 3/3") and "'adverb'" in result.error


def test_retry_loop_counts_generation_errors_and_resends_original() -> None:
    generator = ScriptedGenerator([GenerationError("HTTP 503"), "junk", GOOD_TEXT])
    result = caption_with_retries(generator, a_request(), retries=2, captioner="fake", version="1")
    assert result.ok and result.attempts == 3
    assert generator.requests[1].prompt == PROMPT
    failed = caption_with_retries(ScriptedGenerator([GenerationError("down")]), a_request(), 0, "fake", "1")
    assert failed.status == "failed" and "request failed: down" in failed.error and failed.attempts == 1


def test_prompt_captioner_frames_and_reference(tmp_path: Path) -> None:
    Image.new("RGB", (6, 6), (255, 0, 0)).save(tmp_path / "default.png")
    Image.new("RGB", (5, 5), (0, 255, 0)).save(tmp_path / "ep01.jpg")
    generator = ScriptedGenerator([GOOD_TEXT, GOOD_TEXT])
    captioner = PromptCaptioner("fake", "1", generator, num_frames=3, retries=0, references=ReferenceImages(tmp_path))
    assert captioner.caption(make_ctx("ep01")).ok and captioner.caption(make_ctx("zz")).ok
    first, second = generator.requests
    assert len(first.frames) == 3 and first.frames[0].size == (FRAME_W, FRAME_H)
    assert first.reference.size == (5, 5) and second.reference.size == (6, 6)  # film picture, then default
    parts = content_parts(first)
    assert parts[0] == ("text", REFERENCE_LABEL) and parts[1][0] == IMAGE  # the reference is labelled
    assert [kind for kind, _ in parts].count(IMAGE) == 4 and parts[-1] == ("text", PROMPT)
    for key in fields.ANSWER_FIELDS + fields.STATE_FIELDS:
        assert f'"{key}"' in PROMPT


# --------------------------------------------------------------------------- http backend
def http_cfg(url: str, **overrides: Any) -> CaptionConfig:
    base = dict(backend="http", url=url, model_name="tiny-vl", api_key_env="TEST_CAPTION_KEY", num_frames=3,
                retries=2, timeout_s=5.0, max_new_tokens=64)
    base.update(overrides)
    return CaptionConfig(**base)


def test_http_malformed_then_good(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TEST_CAPTION_KEY", "sk-test")
    Image.new("RGB", (7, 9), (1, 2, 3)).save(tmp_path / "ep01.png")
    with FakeChatServer([(200, "Sure, the character is talking."), (200, f"```json\n{GOOD_TEXT}\n```")]) as server:
        captioner = build_captioner(http_cfg(server.url, reference_images=str(tmp_path)))
        assert captioner.needs_frames
        result = captioner.caption(make_ctx("ep01"))
    assert result.status == "ok" and result.attempts == 2, result.error
    assert result.captioner == "http" and result.captioner_version.startswith("tiny-vl@")
    assert build_instruction(result.caption) == "Character: Sosuke; Motion: softly talk; Background: evening seaside village."
    first, second = server.requests
    assert first["path"] == "/v1/chat/completions"
    assert first["headers"]["Authorization"] == "Bearer sk-test"
    body = first["body"]
    assert body["model"] == "tiny-vl" and body["temperature"] == 0 and body["max_tokens"] == 64
    content = body["messages"][0]["content"]
    urls = [part["image_url"]["url"] for part in content if part["type"] == "image_url"]
    assert len(urls) == 1 + 3  # reference + num_frames
    images = [Image.open(io.BytesIO(base64.b64decode(u.split(",", 1)[1]))) for u in urls]
    assert all(u.startswith("data:image/png;base64,") for u in urls) and images[0].format == "PNG"
    assert images[0].size == (7, 9) and images[1].size == (FRAME_W, FRAME_H)
    assert content[0] == {"type": "text", "text": REFERENCE_LABEL}
    assert "no JSON object" in second["body"]["messages"][0]["content"][-1]["text"]


def test_http_server_errors_are_failed_attempts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TEST_CAPTION_KEY", raising=False)
    with FakeChatServer([(500, '{"error": "overloaded"}')] * 3) as server:
        captioner = build_http_captioner(http_cfg(server.url), backoff_s=0.0)
        result = captioner.caption(make_ctx())
    assert result.status == "failed" and result.attempts == 3 and len(server.requests) == 3
    assert "HTTP 500" in result.error and "overloaded" in result.error
    assert "Authorization" not in server.requests[0]["headers"]


def test_http_error_then_good_and_timeout() -> None:
    with FakeChatServer([(503, "busy"), (200, GOOD_TEXT)]) as server:
        result = build_http_captioner(http_cfg(server.url), backoff_s=0.0).caption(make_ctx())
    assert result.ok and result.attempts == 2
    with FakeChatServer([(200, GOOD_TEXT)], delay_s=1.0) as server:
        result = build_http_captioner(http_cfg(server.url, timeout_s=0.2, retries=0), backoff_s=0.0).caption(make_ctx())
    assert result.status == "failed" and "timed out" in result.error.lower()


def test_http_unreachable_endpoint() -> None:
    with FakeChatServer([]) as server:
        url = server.url
    result = build_http_captioner(http_cfg(url, retries=0), backoff_s=0.0).caption(make_ctx())
    assert result.status == "failed" and "request failed" in result.error


# --------------------------------------------------------------------------- vlm backend, real tiny model
TINY_VOCAB_WORDS = list("abcdefghijklmnopqrstuvwxyz{}[]\":,-0123456789") + ["USER:", "ASSISTANT:"]
TINY_SPECIALS = ["<unk>", "<pad>", "<s>", "</s>", "<image>"]
TINY_CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] | upper }}: "
    "{% for c in m['content'] %}{% if c['type'] == 'image' %}<image> {% else %}{{ c['text'] }} {% endif %}{% endfor %}"
    "{% endfor %}{% if add_generation_prompt %}ASSISTANT: {% endif %}"
)


def build_tiny_llava(folder: Path) -> None:
    """A random-weight LLaVA (CLIP tower + Llama) with a from-scratch tokenizer: no download needed."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import (
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
        PreTrainedTokenizerFast,
    )
    from transformers.models.llava.image_processing_pil_llava import LlavaImageProcessorPil

    vocab = {token: i for i, token in enumerate(TINY_SPECIALS + TINY_VOCAB_WORDS)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.decoder = decoders.WordPiece()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="<unk>", pad_token="<pad>", bos_token="<s>", eos_token="</s>",
        extra_special_tokens={"image_token": "<image>"},
    )
    image_processor = LlavaImageProcessorPil(size={"shortest_edge": 16}, crop_size={"height": 16, "width": 16})
    processor = LlavaProcessor(
        image_processor=image_processor, tokenizer=tokenizer, patch_size=8, vision_feature_select_strategy="default",
        chat_template=TINY_CHAT_TEMPLATE, num_additional_image_tokens=1,  # CLIP's CLS token
    )
    config = LlavaConfig(
        vision_config=CLIPVisionConfig(
            hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=16, patch_size=8
        ),
        text_config=LlamaConfig(
            vocab_size=len(vocab), hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
            num_key_value_heads=2, max_position_embeddings=2048, bos_token_id=2, eos_token_id=3, pad_token_id=1,
        ),
        image_token_id=vocab["<image>"], vision_feature_select_strategy="default", vision_feature_layer=-1,
    )
    torch.manual_seed(0)
    LlavaForConditionalGeneration(config).save_pretrained(folder)
    processor.save_pretrained(folder)


@pytest.fixture(scope="module")
def tiny_vlm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("torch")
    folder = tmp_path_factory.mktemp("tiny_llava")
    build_tiny_llava(folder)
    return folder


def test_vlm_end_to_end_random_weights_fail_after_retries(tiny_vlm: Path, tmp_path: Path) -> None:
    from data_pipeline.captioners import vlm

    Image.new("RGB", (20, 12), (9, 9, 9)).save(tmp_path / "default.png")
    cfg = CaptionConfig(backend="vlm", model_path=str(tiny_vlm), num_frames=2, retries=1, max_new_tokens=8,
                        reference_images=str(tmp_path))
    vlm.load_vlm.cache_clear()
    captioner = build_captioner(cfg)
    assert captioner.name == "vlm" and captioner.version.startswith(f"{tiny_vlm.name}@")
    assert vlm.load_vlm.cache_info().currsize == 0  # lazy: nothing loaded at construction
    result = captioner.caption(make_ctx())
    assert result.status == "failed" and result.attempts == cfg.retries + 1
    assert result.caption is None and result.states is None
    assert "unusable answer" in result.error and result.error.startswith("attempt 2/2")
    captioner.caption(make_ctx(start=2.0, end=4.0))
    info = vlm.load_vlm.cache_info()
    assert info.misses == 1 and info.hits >= 3  # loaded once per process, reused for every attempt


def test_vlm_generator_returns_text(tiny_vlm: Path) -> None:
    from data_pipeline.captioners.vlm import TransformersGenerator

    generator = TransformersGenerator(str(tiny_vlm), trust_remote_code=False, max_new_tokens=5)
    request = CaptionRequest(PROMPT, (Image.new("RGB", (30, 20)),) * 2, reference=Image.new("RGB", (16, 16)))
    first, second = generator(request), generator(request)
    assert isinstance(first, str) and first == second  # greedy decoding is deterministic


def test_vlm_missing_model_folder(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="model_path"):
        build_captioner(CaptionConfig(backend="vlm", model_path=str(tmp_path / "missing")))


def test_logging_only(caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    """Backends report through logging (the pipeline routes it per rank), never print."""
    path = write_jsonl(tmp_path / "c.jsonl", [record("ep01", 0, 1)])
    with caplog.at_level(logging.INFO, logger="data_pipeline.captioners"):
        build_captioner(CaptionConfig(backend="jsonl", path=str(path)))
    assert any("caption import" in message for message in caplog.messages)


# --------------------------------------------------------------------------- the pipeline's captioners
def test_one_worker_captions_several_films_named_by_file_name(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A worker's cached captioner resolves the aliases of every film it handles, not only the first's,
    and a worker (which sees only its own films) does not warn about the others."""
    from data_pipeline import process

    monkeypatch.setattr(process, "_CAPTIONERS", {})
    monkeypatch.setattr(process, "_FILM_PATHS", {}, raising=False)
    films = {"ep01": str(tmp_path / "films" / "ep01.mkv"), "ep02": str(tmp_path / "films" / "ep02.mp4")}
    path = write_jsonl(tmp_path / "c.jsonl", [record("ep01.mkv", 0, 9, "Qiqi"), record("ep02.mp4", 0, 9, "Lulu")])
    cfg = CaptionConfig(backend="jsonl", path=str(path))
    with caplog.at_level(logging.WARNING, logger="data_pipeline.captioners"):
        results = {film_id: process.captioner_for(cfg, {film_id: film_path}).caption(make_ctx(film_id))
                   for film_id, film_path in films.items()}
    assert {film_id: r.caption.character for film_id, r in results.items() if r.ok} == {"ep01": "Qiqi", "ep02": "Lulu"}
    assert not [m for m in caplog.messages if "not among the inputs" in m]


def test_run_captioner_warns_once_about_unknown_films(caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    """The run's pre-flight knows every film of the run: only a record naming none of them is warned about."""
    from animegamer.config.schema import PipelineConfig
    from data_pipeline.preflight import build_run_captioner

    path = write_jsonl(tmp_path / "c.jsonl", [record("ep01.mkv", 0, 9), record("ep02", 0, 9), record("ep3", 0, 9)])
    cfg = PipelineConfig(caption=CaptionConfig(backend="jsonl", path=str(path)))
    films = {str(tmp_path / "ep01.mkv"): "ep01", str(tmp_path / "ep02.mp4"): "ep02"}
    with caplog.at_level(logging.WARNING, logger="data_pipeline.captioners"):
        build_run_captioner(cfg, films)
    warnings = [m for m in caplog.messages if "not among the inputs" in m]
    assert warnings == ["caption records name films that are not among the inputs: ['ep3'] (the inputs' film ids: "
                        "['ep01', 'ep02']; a record may also name a film by its file name or path)"]


# --------------------------------------------------------------------------- http backend: limits and secrets
CAPTION_KEY = "sk-caption-secret-4711"
URL_PASSWORD = "pw-caption-secret-0815"
QUERY_KEY = "qk-caption-secret-2342"


def test_http_trickled_answer_is_cut_at_the_request_deadline() -> None:
    """A byte every 0.2 s keeps each read within timeout_s: only the whole request's deadline ends it."""
    with FakeChatServer([trickle(GOOD_TEXT, 0.2)]) as server:
        captioner = build_http_captioner(http_cfg(server.url, deadline_s=0.5, retries=0), backoff_s=0.0)
        started = time.monotonic()
        result = captioner.caption(make_ctx())
        elapsed = time.monotonic() - started
    assert result.status == "failed" and result.attempts == 1
    assert "within the request deadline of 0.5 s (pipeline.caption.deadline_s)" in result.error, result.error
    assert 0.5 <= elapsed < 3.0  # the whole answer would have taken len(body) * 0.2 s > 30 s


def test_http_silent_server_spends_the_budget_then_fails_every_clip_at_once() -> None:
    with FakeChatServer([], otherwise=silent) as server:
        captioner = build_http_captioner(http_cfg(server.url, deadline_s=0.3, budget_s=0.5, retries=2), backoff_s=0.0)
        started = time.monotonic()
        results = [captioner.caption(make_ctx(start=float(i), end=i + 1.0)) for i in range(3)]
        elapsed = time.monotonic() - started
    # Clip 1: the first attempt ends at its 0.3 s deadline, the second at the budget's last 0.2 s; the
    # budget ending is not retried, and the clips after it send no request.
    assert len(server.requests) == 2 and [r.attempts for r in results] == [2, 1, 1]
    assert "ran out during a request" in results[0].error and "(pipeline.caption.budget_s)" in results[0].error
    assert all("request budget of 0.5 s (pipeline.caption.budget_s) is spent" in r.error for r in results[1:])
    assert 0.5 <= elapsed < 3.0, elapsed


def test_http_huge_answer_is_refused_at_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    import animegamer.utils.http as http_client

    cap, total = 64 * 1024, 40 * 2**20
    monkeypatch.setattr(http_client, "MAX_RESPONSE_BYTES", cap)
    script = [huge(total, announce=True, text=GOOD_TEXT), huge(total, announce=False, text=GOOD_TEXT)]
    with FakeChatServer(script) as server:
        result = build_http_captioner(http_cfg(server.url, retries=1), backoff_s=0.0).caption(make_ctx())
    assert result.status == "failed" and result.attempts == 2 and len(server.requests) == 2
    assert f"exceeds the cap of {cap} bytes on an answer; reading stopped" in result.error, result.error
    assert server.sent_bytes < total  # neither body was read to its end (the first not at all)


def test_http_authorization_stays_with_the_endpoints_host_on_a_redirect(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_CAPTION_KEY", CAPTION_KEY)
    with FakeChatServer([(200, GOOD_TEXT)]) as other:
        target = other.url_on("localhost") + "/chat/completions"
        with FakeChatServer([redirect(target)]) as server:
            result = build_http_captioner(http_cfg(server.url, retries=0), backoff_s=0.0).caption(make_ctx())
    assert result.ok, result.error
    assert server.requests[0]["headers"]["Authorization"] == f"Bearer {CAPTION_KEY}"
    assert other.requests[0]["method"] == "GET" and "Authorization" not in other.requests[0]["headers"]


def test_http_refused_key_fails_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_CAPTION_KEY", CAPTION_KEY)
    with FakeChatServer([], otherwise=(401, '{"error": "invalid api key"}')) as server:
        result = build_http_captioner(http_cfg(server.url, retries=2), backoff_s=0.0).caption(make_ctx())
    assert len(server.requests) == 1 and result.status == "failed" and result.attempts == 1
    assert "HTTP 401" in result.error and "not retried" in result.error
    assert "pipeline.caption.api_key_env" in result.error and "invalid api key" in result.error


def test_http_key_in_api_key_env_is_refused_by_both_checks() -> None:
    from animegamer.config.schema import PipelineConfig
    from animegamer.config.validate import check_pipeline

    cfg = http_cfg("http://127.0.0.1:9/v1", api_key_env=CAPTION_KEY)
    with pytest.raises(ValueError, match="caption.api_key_env must name an environment variable") as error:
        build_captioner(cfg)
    assert CAPTION_KEY not in str(error.value)
    problems = [p for p in check_pipeline(PipelineConfig(caption=cfg)) if "api_key_env" in p]
    assert len(problems) == 1 and problems[0].startswith("pipeline.caption.api_key_env must name an environment")
    assert CAPTION_KEY not in problems[0]
    # every backend's config is recorded in the manifests: the check does not depend on the backend
    assert any("api_key_env" in p for p in check_pipeline(PipelineConfig(caption=CaptionConfig(api_key_env="a-b"))))
    problems = check_pipeline(PipelineConfig(caption=http_cfg("http://h/v1", deadline_s=0, budget_s=-1.0)))
    assert "pipeline.caption.deadline_s=0 must be > 0" in problems
    assert "pipeline.caption.budget_s=-1.0 must be >= 0 (0: no limit)" in problems


def test_http_secrets_reach_no_shard_manifest_report_or_log(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, toy_film: Any, tmp_path: Path
) -> None:
    """A server echoing the key (and the URL's password and query key) in its error body: the pre-flight's
    refusal, the caption failure reasons that the shards keep, the manifests' config, the report and the
    log mask them."""
    import tarfile

    from conftest import pipeline_overrides, run_pipeline

    from animegamer.config.validate import ConfigError

    monkeypatch.setenv("TEST_CAPTION_KEY", CAPTION_KEY)
    echo = (401, json.dumps({"error": f"key {CAPTION_KEY} refused; password {URL_PASSWORD}; query key {QUERY_KEY}"}))
    output = tmp_path / "out"
    with FakeChatServer([], otherwise=echo) as server:
        url = f"http://user:{URL_PASSWORD}@127.0.0.1:{server.port}/v1?key={QUERY_KEY}"
        overrides = ["pipeline.caption.backend=http", f"pipeline.caption.url='{url}'", "pipeline.caption.model_name=m",
                     "pipeline.caption.api_key_env=TEST_CAPTION_KEY", "pipeline.workers=1",
                     "pipeline.clips.max_clips_per_shot=1", "pipeline.steps=[process,finalize]"]
        with pytest.raises(ConfigError, match="HTTP 401 Unauthorized from .*/v1/models") as refused:
            run_pipeline(pipeline_overrides(output, [toy_film.video_path], None, *overrides))
        assert [r["method"] for r in server.requests] == ["GET"] and not output.exists()
        # past the probe and the minimal captioned share: every clip's request is refused in turn
        overrides += ["pipeline.caption.probe=off", "pipeline.caption.min_captioned_share=0"]
        with caplog.at_level(logging.DEBUG):
            run_pipeline(pipeline_overrides(output, [toy_film.video_path], None, *overrides))
    assert len(server.requests) > 1, "the pipeline made no caption request"
    first = server.requests[1]
    assert first["headers"]["Authorization"] == f"Bearer {CAPTION_KEY}"
    assert first["path"] == f"/v1/chat/completions?key={QUERY_KEY}"
    texts = {"log": caplog.text, "refusal": str(refused.value)}
    for path in sorted(output.rglob("*")):
        if path.suffix == ".tar":
            with tarfile.open(path) as tar:
                texts.update({f"{path}:{m.name}": tar.extractfile(m).read().decode("utf-8", "replace")
                              for m in tar.getmembers() if m.name.endswith(".json")})
        elif path.suffix in (".json", ".jsonl", ".md", ".txt", ".log"):
            texts[str(path)] = path.read_text(encoding="utf-8", errors="replace")
    manifest = json.loads((output / "clips" / "manifest.json").read_text())
    assert manifest["config"]["pipeline"]["caption"]["url"] == f"http://***@127.0.0.1:{server.port}/v1?key=***"
    reasons = [text for name, text in texts.items() if ".tar:" in name and "HTTP 401" in text]
    assert reasons, "no shard records the caption failure"
    for name, text in texts.items():
        for secret in (CAPTION_KEY, URL_PASSWORD, QUERY_KEY):
            assert secret not in text, f"{secret} in {name}"
