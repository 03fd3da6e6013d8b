"""What produced a report's numbers: model preset and parameter counts, precision, device and hardware.

The paper's numbers come from the full-size model on the authors' GPUs; a report sets ours beside
them only together with this description (``report.md``'s "Setup" section), so a tiny CPU run is
never read as a like-for-like comparison.
"""
from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Mapping

CPU_INFO = Path("/proc/cpuinfo")
# torch is imported inside the functions that read it: the report writer imports this module and renders
# metrics files without loading torch.


def parameter_count(module) -> int:
    """All parameters of a torch module (0 for anything without parameters)."""
    parameters = getattr(module, "parameters", None)
    return sum(p.numel() for p in parameters()) if callable(parameters) else 0


def cpu_model() -> str:
    """The CPU's model name (Linux ``/proc/cpuinfo``; elsewhere what ``platform`` knows) and core count."""
    name = ""
    if CPU_INFO.is_file():
        for line in CPU_INFO.read_text(errors="replace").splitlines():
            if line.lower().startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    name = name or platform.processor() or platform.machine() or "unknown CPU"
    return f"{name}, {os.cpu_count()} cores"


def device_name(device) -> str:
    """The accelerator's name (``torch.cuda.get_device_name``) or the CPU model."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpu_model()


def describe_setup(model_name: str, parts: Mapping[str, object], device, dtype, **extra) -> dict:
    """The setup record a report prints: ``parts`` maps a label ("MLLM", "renderer", ...) to its module."""
    return {"model": model_name, "parameters": {label: parameter_count(m) for label, m in parts.items()},
            "dtype": str(dtype).removeprefix("torch."), "device": str(device), "hardware": device_name(device),
            "cpu": cpu_model(), "torch": _torch_version(), **extra}


def _torch_version() -> str:
    import torch

    return torch.__version__


def format_count(count: int) -> str:
    """12 -> "12", 62_800 -> "62.8 K", 7_241_732_096 -> "7.24 B"."""
    for size, suffix in ((10**9, "B"), (10**6, "M"), (10**3, "K")):
        if count >= size:
            return f"{count / size:.3g} {suffix}"
    return str(count)
