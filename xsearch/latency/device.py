"""What a latency was measured on: the CPU, cores, threads and library versions (no torch import)."""

from __future__ import annotations

import os
import platform
import subprocess
from importlib import metadata
from typing import Any


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def package_version(package: str) -> str | None:
    """The installed version of ``package`` without a local suffix (``2.13.0+cpu`` -> ``2.13.0``), or None."""
    try:
        return metadata.version(package).split("+")[0]
    except metadata.PackageNotFoundError:
        return None


def host_fingerprint(threads: int | None) -> dict[str, Any]:
    """The CPU side of every target's fingerprint: CPU model, cores, threads, torch and onnxruntime versions."""
    return {
        "cpu": cpu_name(),
        "cores": os.cpu_count(),
        "threads": threads,
        "torch": package_version("torch"),
        "onnxruntime": package_version("onnxruntime"),
    }


def nvidia_gpu_name() -> str | None:
    """The first GPU's name as ``nvidia-smi`` reports it (None without one)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True)  # fmt: skip
    except OSError:
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None


def describe_device(device: dict[str, Any]) -> str:
    """A short label of a device fingerprint: ``"AMD EPYC ..., 2 threads, onnxruntime 1.32.0, torch 2.13.0"``."""
    parts = [str(device.get("gpu") or device.get("cpu") or "?"), f"{device.get('threads')} threads"]
    parts += [f"{k} {device[k]}" for k in ("onnxruntime", "torch") if device.get(k)]
    return ", ".join(parts)
