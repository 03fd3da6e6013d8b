"""FP8 matmuls for the decoder's frozen base weights (``model.decoder.fp8``), through torchao.

torchao's float8 training (``convert_to_float8_training``) swaps chosen ``nn.Linear`` modules for its
``Float8Linear``: same parameters and state-dict keys (the weight stays in its own precision), and
each matmul casts input and weight to float8 with dynamic scales, forward and backward. Only the
linears of each transformer block that no phase trains are converted (:data:`BLOCK_TARGETS`: the
attention projections, which LoRA wraps, and the feed-forward), and they carry almost all of the
decoder's FLOPs; the LoRA matrices, the AdaLN modulation, the time and motion-scope embedders, the
final AdaLN and the narrow output projection stay in bf16 (they train, multiply one vector per sample,
or are too small for the casts to pay).

Conversion comes after the LoRA injection (peft's wrapper keeps the original Linear as
``base_layer``; that inner Linear is converted, the adapter matrices beside it are not) and before the
first call of the compiled transformer (``torch.compile`` traces at the first call, so it sees the
float8 modules). torchao's casts are fast only compiled, and only compiled is the weight-gradient
product of a frozen weight, which torchao's backward always forms, dropped as unused (the backward
graph of a frozen ``Float8Linear`` holds one product, the input gradient; tests/test_fp8.py). Merging
LoRA into a converted model folds into the high-precision weight that ``Float8Linear`` keeps, as for a
plain Linear.

``tensorwise`` scales each tensor by one factor (cuBLAS's float8 kernel, the fastest); ``rowwise``
scales each row (CUTLASS's kernel, power-of-two scales; more accurate, slower). Float8 tensor cores
need CUDA compute capability 8.9 (Ada, Hopper) or above; ``torch._scaled_mm`` needs the weight's
sizes to be multiples of 16.

Play (the game, evaluation) never trains, so it does not keep the bf16 weight and cast it at every call
as ``Float8Linear`` does: :func:`apply_play_fp8` stores the same linears' weights in float8 once, after
the LoRA merge and the cast (torchao's float8 inference: a weight with its scale, per tensor or per row,
and the activation scaled at each call), which saves reading the bf16 weights and casting them every
denoising step. The two paths round differently (e.g. per-row scales are not powers of two in play), so
play's samples are measured against bf16 on their own (``benchmarks/fp8_decoder.py``'s ``play_fp8``
sample). torchao's per-row weights must be bfloat16, so ``rowwise`` play refuses other dtypes.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import logging
from typing import TYPE_CHECKING, Callable, Optional, Sequence

import torch
from torch import nn

from animegamer.config.validate import ConfigError, choice
from animegamer.models.lora import PEFT_BASE, is_lora_name

if TYPE_CHECKING:
    from animegamer.config.schema import DecoderConfig

logger = logging.getLogger(__name__)

OFF = "off"
FP8_RECIPES = (OFF, "tensorwise", "rowwise")  # torchao Float8LinearRecipeName values besides off
FP8_EXTRA = "fp8"  # setup.cfg's optional extra that installs torchao
MIN_CAPABILITY = (8, 9)  # float8 tensor cores: Ada (8.9) and Hopper (9.0) onwards
ALIGNMENT = 16  # torch._scaled_mm: both sizes of the weight operand are multiples of 16
FF_MULT = 4  # diffusers' CogVideoX feed-forward: inner width 4 x hidden
BLOCKS = "transformer_blocks."
# Per-block linears no phase trains (phase a/c train LoRA beside the attention projections, the AdaLN
# norm1/norm2 linears and the motion-scope embedder, none of these).
BLOCK_TARGETS = ("attn1.to_q", "attn1.to_k", "attn1.to_v", "attn1.to_out.0", "ff.net.0.proj", "ff.net.2")


def fp8_enabled(dec: "DecoderConfig") -> bool:
    return dec.fp8 != OFF


def converted_widths(dec: "DecoderConfig") -> dict[str, int]:
    """The sizes of the converted weights: the hidden width and the feed-forward's inner width."""
    hidden = dec.num_attention_heads * dec.attention_head_dim
    return {"hidden (num_attention_heads x attention_head_dim)": hidden, "feed-forward inner (4 x hidden)":
            FF_MULT * hidden}


def fp8_device_problem(device: Optional[torch.device] = None) -> Optional[str]:
    """Why float8 matmuls cannot run on ``device`` (default: the current CUDA device), or None."""
    if device is not None and torch.device(device).type != "cuda":
        return f"float8 matmuls need a CUDA GPU (this run plays on {torch.device(device)})"
    if not torch.cuda.is_available():
        return "float8 matmuls need a CUDA GPU (found none)"
    index = torch.device(device).index if device is not None else None
    capability = torch.cuda.get_device_capability(index)
    if capability < MIN_CAPABILITY:
        name = torch.cuda.get_device_name(index)
        return (f"float8 matmuls need CUDA compute capability >= {MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]} "
                f"(Ada, Hopper or newer); {name} has {capability[0]}.{capability[1]}")
    return None


def check_decoder_fp8(dec: "DecoderConfig", device: Optional[torch.device] = None) -> list[str]:
    """``model.decoder.fp8``: a recipe, torchao installed, a float8-capable GPU, aligned weight sizes."""
    problems = choice("model.decoder.fp8", str(dec.fp8), FP8_RECIPES)
    if problems or not fp8_enabled(dec):
        return problems
    key = f"model.decoder.fp8={dec.fp8!r}"
    if importlib.util.find_spec("torchao") is None:
        problems.append(f"{key} needs torchao: pip install 'animegamer[{FP8_EXTRA}]' (or torchao), or set "
                        f"model.decoder.fp8={OFF}")
    reason = fp8_device_problem(device)
    if reason:
        problems.append(f"{key}: {reason}; set model.decoder.fp8={OFF}")
    problems += [f"{key}: the {name} is {width}, not a multiple of {ALIGNMENT} (torch._scaled_mm needs both sizes "
                 f"of a float8 weight to be)" for name, width in converted_widths(dec).items()
                 if width % ALIGNMENT]
    return problems


def check_play_fp8(dec: "DecoderConfig", devices: Sequence[torch.device], dtype: torch.dtype) -> list[str]:
    """:func:`check_decoder_fp8` for every device a decoder plays on, and ``rowwise``'s bfloat16 weights."""
    problems = [p for device in devices for p in check_decoder_fp8(dec, device)]
    if dec.fp8 == "rowwise" and dtype != torch.bfloat16:
        problems.append(f"model.decoder.fp8='rowwise' plays with bfloat16 weights (torchao's per-row float8), "
                        f"not {str(dtype).removeprefix('torch.')}; play in bfloat16 or use tensorwise")
    return list(dict.fromkeys(problems))  # the same device twice is one problem


def converts(fqn: str) -> bool:
    """Whether the Linear at ``fqn`` (inside the diffusers transformer) is one of the converted ones."""
    if not fqn.startswith(BLOCKS) or is_lora_name(fqn):
        return False
    path = fqn.removesuffix(PEFT_BASE.rstrip("."))  # peft keeps the wrapped Linear as ``<target>.base_layer``
    return path.endswith(tuple("." + target for target in BLOCK_TARGETS))


def checked_recipe(recipe: str) -> str:
    if recipe not in FP8_RECIPES or recipe == OFF:
        raise ValueError(f"float8 recipe {recipe!r} is not one of {FP8_RECIPES[1:]}")
    return recipe


def picker(chosen: list[str]) -> Callable[[nn.Module, str], bool]:
    """torchao's module filter for the linears :func:`converts` names, noting each in ``chosen``."""
    def keep(module: nn.Module, fqn: str) -> bool:
        if isinstance(module, nn.Linear) and converts(fqn):
            chosen.append(fqn)
            return True
        return False

    return keep


def float8_config(recipe: str, emulate: bool = False):
    """torchao's config for ``recipe``. ``pad_inner_dim``: the weight gradient's inner size is the token
    count, which need not be a multiple of 16 (padded only where it is not). ``emulate`` runs the float8
    casts with float32 matmuls, on any device (CPU tests)."""
    from torchao.float8 import Float8LinearConfig

    base = Float8LinearConfig.from_recipe_name(recipe)
    return dataclasses.replace(base, pad_inner_dim=True, emulate=emulate)


def convert_to_fp8(transformer: nn.Module, recipe: str, emulate: bool = False) -> list[str]:
    """Swap the frozen base linears of ``transformer`` for torchao's Float8Linear in place; returns their
    names (module paths). Parameters and their names are unchanged."""
    from torchao.float8 import convert_to_float8_training

    chosen: list[str] = []
    convert_to_float8_training(transformer, module_filter_fn=picker(chosen),
                               config=float8_config(checked_recipe(recipe), emulate))
    return chosen


def play_granularity(recipe: str):
    """torchao's inference granularity for ``recipe``: one scale per tensor or one per row."""
    from torchao.quantization import PerRow, PerTensor

    return PerTensor() if checked_recipe(recipe) == "tensorwise" else PerRow()


def quantize_for_play(transformer: nn.Module, recipe: str) -> list[str]:
    """Store the weights of the linears :func:`converts` picks as float8 (static, with their scales), in
    place; returns the names of those whose weight is float8 now (torchao leaves a weight whose sizes
    ``torch._scaled_mm`` cannot take as it was). For frozen use only: the weights no longer train.
    ``set_inductor_config=False``: torchao would otherwise switch on inductor's coordinate-descent tuning
    for the whole process (longer compiles, for every model compiled after)."""
    from torchao.quantization import Float8DynamicActivationFloat8WeightConfig, Float8Tensor, quantize_

    chosen: list[str] = []
    config = Float8DynamicActivationFloat8WeightConfig(granularity=play_granularity(recipe), set_inductor_config=False)
    quantize_(transformer, config, filter_fn=picker(chosen))
    return [name for name in chosen if isinstance(transformer.get_submodule(name).weight, Float8Tensor)]


def apply_play_fp8(decoder: nn.Module) -> None:
    """Play's ``model.decoder.fp8``: refuse where float8 cannot run, then quantize the frozen decoder's base
    weights once. Called after the LoRA merge and the move to the playing device and dtype."""
    dec = decoder.cfg
    if not fp8_enabled(dec):
        return
    weight = next(decoder.transformer.parameters())
    refuse(check_play_fp8(dec, [weight.device], weight.dtype))
    names = quantize_for_play(decoder.transformer, dec.fp8)
    logger.info("decoder: %d frozen linears hold float8 weights for play (%s scaling)", len(names), dec.fp8)


def refuse(problems: list[str]) -> None:
    if problems:
        raise ConfigError(problems)


def apply_decoder_fp8(decoder: nn.Module) -> None:
    """The config path (``model.decoder.fp8``): refuse where float8 cannot run, then convert the
    decoder's transformer. Called once the LoRA adapter and every weight are in place."""
    dec = decoder.cfg
    if not fp8_enabled(dec):
        return
    refuse(check_decoder_fp8(dec))
    names = convert_to_fp8(decoder.transformer, dec.fp8)
    logger.info("decoder: %d frozen linears run float8 matmuls (%s scaling)", len(names), dec.fp8)
    if not dec.compile:
        # Eager, every cast is its own kernel and torchao's backward also forms the frozen weights'
        # (discarded) gradient products: expect no speed-up over bf16.
        logger.warning("model.decoder.fp8=%s without model.decoder.compile=true: torchao's float8 casts run "
                       "unfused; compile the decoder for a speed-up", dec.fp8)
