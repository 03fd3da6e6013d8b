"""The ``vlm`` backend: a local transformers image-text-to-text model (Qwen2-VL, LLaVA, Idefics3, ...).

The model folder is loaded lazily, once per process (:func:`load_vlm` is cached), with
``local_files_only=True``: a pipeline worker must never start downloading weights. Remote code runs
only when ``caption.trust_remote_code`` says so.
"""
from __future__ import annotations

import functools
import logging
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from .base import BACKEND_VLM, FilmPaths
from .prompting import (
    IMAGE,
    TEXT,
    CaptionRequest,
    PromptCaptioner,
    ReferenceImages,
    content_parts,
    settings_version,
)

if TYPE_CHECKING:
    from animegamer.config.schema import CaptionConfig

logger = logging.getLogger(__name__)

# Files whose bytes identify a model folder cheaply (weights are identified by name and size only:
# hashing many GB per run would cost more than captioning a film).
MODEL_IDENTITY_FILES: tuple[str, ...] = ("config.json", "generation_config.json", "chat_template.jinja")
# Two threads captioning their first clips at once must not load two copies of the model.
_LOAD_LOCK = threading.Lock()


@functools.lru_cache(maxsize=None)
def load_vlm(model_path: str, trust_remote_code: bool) -> tuple[Any, Any]:
    """(processor, model) on the best local device; cached so every clip of a process shares one copy."""
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    if torch.cuda.is_available():
        device = "cuda"
        dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    else:
        device, dtype = "cpu", torch.float32  # half precision on CPU is slow or unsupported
    logger.info("loading caption VLM from %s on %s (%s)", model_path, device, dtype)
    options = {"local_files_only": True, "trust_remote_code": trust_remote_code}
    processor = AutoProcessor.from_pretrained(model_path, **options)
    model = AutoModelForImageTextToText.from_pretrained(model_path, dtype=dtype, **options)
    return processor, model.to(device).eval()


def chat_messages(request: CaptionRequest) -> tuple[list[dict[str, Any]], list[Any]]:
    """One user turn in the transformers multimodal chat format, and its images in the same order."""
    content: list[dict[str, Any]] = []
    images = []
    for kind, value in content_parts(request):
        if kind == IMAGE:
            content.append({"type": "image"})
            images.append(value)
        else:
            assert kind == TEXT
            content.append({"type": "text", "text": value})
    return [{"role": "user", "content": content}], images


class TransformersGenerator:
    """Answers a :class:`CaptionRequest` with greedy decoding; knows nothing about parsing or retries."""

    def __init__(self, model_path: str, trust_remote_code: bool, max_new_tokens: int) -> None:
        self.model_path = model_path
        self.trust_remote_code = trust_remote_code
        self.max_new_tokens = max_new_tokens

    def __call__(self, request: CaptionRequest) -> str:
        import torch

        with _LOAD_LOCK:
            processor, model = load_vlm(self.model_path, self.trust_remote_code)
        messages, images = chat_messages(request)
        # Render the template to text, then let the processor expand each image placeholder into
        # the model's image tokens: this two-step path works across processor families.
        prompt = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        inputs = processor(images=images, text=[prompt], return_tensors="pt").to(model.device, dtype=model.dtype)
        with torch.inference_mode():
            output = model.generate(**inputs, do_sample=False, num_beams=1, max_new_tokens=self.max_new_tokens)
        new_tokens = output[:, inputs["input_ids"].shape[1] :]
        return processor.batch_decode(new_tokens, skip_special_tokens=True)[0]


def model_fingerprint(model_path: str | Path) -> str:
    """Identity of a model folder: small config files by content, every other file by name and size."""
    folder = Path(model_path)
    parts = []
    for file in sorted(p for p in folder.iterdir() if p.is_file()):
        if file.name in MODEL_IDENTITY_FILES:
            parts.append(f"{file.name}:{file.read_bytes()!r}")
        else:
            parts.append(f"{file.name}:{file.stat().st_size}")
    return "\n".join(parts)


def build_vlm_captioner(
    cfg: "CaptionConfig", film_paths: Optional[FilmPaths] = None
) -> PromptCaptioner:
    """The ``vlm`` backend for ``cfg``; nothing is loaded until the first clip is captioned."""
    references = ReferenceImages(cfg.reference_images or None, film_paths)
    version = settings_version(
        model_fingerprint(cfg.model_path), cfg.num_frames, cfg.max_new_tokens, references.fingerprint()
    )
    generator = TransformersGenerator(cfg.model_path, cfg.trust_remote_code, cfg.max_new_tokens)
    return PromptCaptioner(
        name=BACKEND_VLM,
        version=f"{Path(cfg.model_path).name}@{version}",
        generate=generator,
        num_frames=cfg.num_frames,
        retries=cfg.retries,
        references=references,
    )
