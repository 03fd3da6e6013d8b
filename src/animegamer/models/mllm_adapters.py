"""Adapter folders of the game-state MLLM (:class:`AdapterFolders`, a part of
:class:`animegamer.models.mllm.GameStateMLLM`): the peft LoRA folder plus the other trained tensors
(projections, norms, embeddings) under names independent of the peft wrapping."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import List, Mapping

import torch

from animegamer.checkpoints.safe_load import load_safetensors
from animegamer.models import lora
from animegamer.utils.io import save_tensors
from animegamer.utils.state import clean_name, require

MODULES_FILE = "mllm_modules.safetensors"  # projections + trained norms / embeddings
META_FILE = "mllm_meta.json"
_PEFT_PREFIX = "llm.base_model.model."
_LORA_RE = re.compile(r"\.(lora_[AB])\.[^.]+\.weight$")


def canonical_name(name: str) -> str:
    """A parameter name independent of peft wrapping: ``llm.<MistralForCausalLM name>`` or the projection name.

    ``llm.base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight`` ->
    ``llm.model.layers.0.self_attn.q_proj.weight``; LoRA matrices lose their adapter name
    (``...q_proj.lora_A.weight``). Saved module files and the official importer use these names, so
    they load into a model with or without LoRA.
    """
    if name.startswith(_PEFT_PREFIX):
        name = "llm." + name[len(_PEFT_PREFIX):]
    name = name.replace(lora.PEFT_BASE, ".")
    return _LORA_RE.sub(r".\1.weight", name)


class AdapterFolders:
    """Save and load what phase (b) trains; reads the MLLM's ``trainable_parameter_names``, ``llm``,
    ``has_lora`` and sizes."""

    def _saved_module_names(self) -> List[str]:
        """Non-LoRA tensors an adapter folder carries: projections, and norms / embeddings when trained."""
        return [n for n in self.trainable_parameter_names() if not lora.is_lora_name(n)]

    def save_adapter(self, folder: str | Path, state: Mapping[str, torch.Tensor] | None = None) -> Path:
        """Write what phase (b) trains: the peft LoRA folder + ``mllm_modules.safetensors``.

        The modules file holds the projections and, when trained, the norms and both embedding
        matrices, under :func:`canonical_name` keys; ``mllm_meta.json`` records the sizes. ``state``:
        whole tensors gathered elsewhere (FSDP saves) under this module's clean parameter names, read
        instead of the (sharded) parameters.
        """
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        saved = self._saved_module_names()
        if self.has_lora:
            adapter = [n for n in self.trainable_parameter_names() if n not in saved]
            lora.save_adapter(self.llm, folder, adapter, state, "llm.", save_embedding_layers=False)
        params = dict(self.named_parameters()) if state is None else state
        require(params, saved)
        modules = {canonical_name(clean_name(n)): params[clean_name(n)].detach().contiguous().cpu() for n in saved}
        save_tensors(modules, folder / MODULES_FILE)
        meta = dict(rep_width=self.rep_width, num_query_tokens=self.num_query_tokens, vocab_size=self.vocab_size,
                    hidden_size=self.hidden, lora=self.has_lora, train_norms=self.cfg.train_norms,
                    train_embeddings=self.cfg.train_embeddings, train_base=self.cfg.train_base)
        (folder / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
        return folder

    def load_adapter(self, folder: str | Path) -> None:
        """Load a folder written by :meth:`save_adapter`; every tensor must fit, none may be left over.

        A model without LoRA gets the folder's adapter (its rank / alpha) added first.
        """
        folder = Path(folder)
        meta = json.loads((folder / META_FILE).read_text())
        for key in ("rep_width", "num_query_tokens", "vocab_size", "hidden_size"):
            mine = self.hidden if key == "hidden_size" else getattr(self, key)
            if meta[key] != mine:
                raise ValueError(f"adapter in {folder} has {key}={meta[key]}, the model {mine}")
        if lora.holds_adapter(folder):
            lora.load_adapter(self, folder, "model")
        elif self.has_lora:
            raise ValueError(f"{folder} holds no LoRA adapter but the model has one")
        by_canonical = {canonical_name(n): p for n, p in self.named_parameters()}
        modules = load_safetensors(folder / MODULES_FILE)
        unknown = sorted(k for k in modules if k not in by_canonical)
        wrong = [f"{k}: file {tuple(v.shape)} vs model {tuple(by_canonical[k].shape)}"
                 for k, v in modules.items() if k in by_canonical and v.shape != by_canonical[k].shape]
        if unknown or wrong:
            raise ValueError(f"{folder / MODULES_FILE} does not fit the model: unknown {unknown}, shapes {wrong}")
        with torch.no_grad():
            for key, value in modules.items():
                param = by_canonical[key]
                param.copy_(value.to(dtype=param.dtype, device=param.device))
