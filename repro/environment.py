"""What bit-for-bit identity of a run depends on, recorded in every run's config.json.

The simulator is deterministic: the same seed and config give byte-identical tables *on the same
torch build, CPU kernel family (or GPU), thread count and device*. Change any of those and the
float reduction order changes, SGD amplifies the last-bit differences, and results agree only
statistically, within the spread over seeds (``python -m repro.analysis compare`` checks that).
:func:`environment` records each of them, so two runs can be told apart before they are compared.
"""
from __future__ import annotations

import platform
import sys
from pathlib import Path

import torch


def cpu_model() -> str:
    """The CPU's model name (Linux: /proc/cpuinfo), else what the platform says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment(device: torch.device | str = "cpu") -> dict:
    """torch build, CPU kernel family, threads and device: what bitwise identity depends on."""
    device = torch.device(device)
    env = {
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,           # None for a CPU build
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),   # the kernel family used
        "cpu_model": cpu_model(),
        "num_threads": torch.get_num_threads(),
        "device": str(device),
        "python": platform.python_version(),
        "platform": f"{sys.platform}-{platform.machine()}",
    }
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        env["gpu"] = torch.cuda.get_device_name(index)
        env["cudnn"] = torch.backends.cudnn.version()
    return env


# What must be equal for two runs to be expected byte-identical (the rest is for the record).
IDENTITY_KEYS = ("torch", "torch_cuda", "cpu_capability", "num_threads", "device", "gpu")


def identity_differences(a: dict, b: dict) -> list[str]:
    """'key: a -> b' for each identity key in which two recorded environments differ."""
    return [f"{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in IDENTITY_KEYS if a.get(k) != b.get(k)]
