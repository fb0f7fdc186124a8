"""What a results file records about the run that made it: one schema for both entry
points.

`run_metadata` gives the keys every results JSON has (preset and its configuration,
device, dtype, versions, commit and the package source's digest, date, threads,
platform, load); each entry point adds its own.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import os
import platform
import subprocess
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
PACKAGE = HERE.parent


def git(*args: str) -> str | None:
    """Output of a git command run from the package's folder; None outside a checkout or
    without git."""
    try:
        done = subprocess.run(
            ["git", *args], cwd=HERE, capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def git_state() -> tuple[str | None, bool | None]:
    """(HEAD commit, whether the package code has uncommitted changes): results being
    written do not count."""
    status = git("status", "--porcelain", "--", str(PACKAGE))
    return git("rev-parse", "HEAD"), None if status is None else bool(status)


# what no benchmark number depends on: the extrapolation study's own modules, this
# metadata, the results folder and the GPU command that runs the stages
NOT_BENCHMARKED = frozenset(
    {
        "study/corpus.py",
        "study/evaluate.py",
        "study/extrapolation.py",
        "study/extrapolation_check.py",
        "study/extrapolation_layers.py",
        "study/extrapolation_weights.py",
        "study/extrapolation_presets.py",
        "study/extrapolation_eval.py",
        "study/extrapolation_budget.py",
        "study/extrapolation_runs.py",
        "study/gpu.py",
        "study/gpu_chapters.py",
        "study/gpu_stages.py",
        "study/longcontext.py",
        "study/ngram.py",
        "study/passkey.py",
        "study/results.py",
        "study/runinfo.py",
        "study/summary.py",
        "study/tasks.py",
        "study/verdicts.py",
    }
)


def source_sha256(
    package: Path = PACKAGE, leave_out: frozenset[str] = frozenset()
) -> str:
    """SHA-256 of posenc's source (every .py file under the package but `leave_out`, by
    relative path and bytes).

    The same wherever the same code is installed (a clone, or pip at a commit in Colab),
    with no git: a chapter compares it with the one its stored results record, to show
    they come from the code it prints.
    """
    digest = hashlib.sha256()
    for path in sorted(
        p for p in package.rglob("*.py") if "__pycache__" not in p.parts
    ):
        if path.relative_to(package).as_posix() not in leave_out:
            digest.update(
                path.relative_to(package).as_posix().encode()
                + b"\0"
                + path.read_bytes()
                + b"\0"
            )
    return digest.hexdigest()


def benchmarked_sha256(package: Path = PACKAGE) -> str:
    """The digest of the code a benchmark measures (`source_sha256` without
    NOT_BENCHMARKED): a change to the extrapolation study leaves the benchmark's stored
    results the results of this code."""
    return source_sha256(package, NOT_BENCHMARKED)


def cpu_model() -> str:
    """The processor's name where the system says it (Linux), else platform's."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def load_average() -> list[float] | None:
    """1, 5 and 15 minute load averages (timings depend on how busy the machine was),
    where the OS has them."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def _installed(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def _smi(*fields: str) -> list[str] | None:
    """nvidia-smi's values of `fields` for the first GPU; None where it cannot say."""
    try:
        done = subprocess.run(
            [
                "nvidia-smi",
                f"--query-gpu={','.join(fields)}",
                "--format=csv,noheader,nounits",
            ],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0 or not done.stdout.strip():
        return None
    values = [v.strip() for v in done.stdout.strip().splitlines()[0].split(",")]
    return values if len(values) == len(fields) else None


def gpu_clocks() -> dict | None:
    """The GPU's clocks now (MHz; SM and memory, with the SM maximum), power (W) and
    temperature (C), from nvidia-smi."""
    fields = (
        "clocks.sm",
        "clocks.max.sm",
        "clocks.mem",
        "power.draw",
        "temperature.gpu",
    )
    values = _smi(*fields)
    if values is None:
        return None

    def number(v: str):
        try:
            return float(v)
        except ValueError:
            return None

    names = ("sm_mhz", "sm_max_mhz", "memory_mhz", "power_w", "temperature_c")
    return dict(zip(names, map(number, values)))


def cuda_info(device: torch.device) -> dict:
    """Name, capability, memory, CUDA runtime and driver of a GPU and the libraries its
    kernels come from; the same keys, None where there is no GPU."""
    info = {
        "name": None,
        "capability": None,
        "total_memory_bytes": None,
        "multiprocessors": None,
        "l2_cache_bytes": None,
        "shared_memory_per_block_optin": None,
        "cuda_runtime": torch.version.cuda,
        "cuda_driver": None,
        "cudnn": None,
        "triton": _installed("triton"),
        "tf32_matmul": None,
        "clocks": None,
    }
    if device.type != "cuda" or not torch.cuda.is_available():
        return info
    props = torch.cuda.get_device_properties(device)
    info.update(
        name=props.name,
        capability=".".join(map(str, torch.cuda.get_device_capability(device))),
        total_memory_bytes=props.total_memory,
        multiprocessors=getattr(props, "multi_processor_count", None),
        l2_cache_bytes=getattr(props, "L2_cache_size", None),
        shared_memory_per_block_optin=getattr(
            props, "shared_memory_per_block_optin", None
        ),
        tf32_matmul=bool(torch.backends.cuda.matmul.allow_tf32),
    )
    try:
        info["cudnn"] = torch.backends.cudnn.version()
    except Exception:  # noqa: BLE001 - no cuDNN in this build
        info["cudnn"] = None
    driver = _smi("driver_version")
    info["cuda_driver"] = driver[0] if driver else None
    info["clocks"] = gpu_clocks()
    return info


def run_metadata(preset: str, config, device, dtype: torch.dtype) -> dict:
    """The keys every results JSON of posenc.study has, for a run of `preset` (its
    configuration a dataclass or dict)."""
    from .. import __version__

    device = torch.device(device)
    gpu = cuda_info(device)
    commit, dirty = git_state()
    config = (
        dataclasses.asdict(config) if dataclasses.is_dataclass(config) else dict(config)
    )
    return {
        "preset": preset,
        "config": json.loads(json.dumps(config)),
        "device": {
            "type": device.type,
            "name": gpu["name"] if device.type == "cuda" else cpu_model(),
            "capability": gpu["capability"]
            if device.type == "cuda"
            else torch.backends.cpu.get_cpu_capability(),
            "total_memory_bytes": gpu["total_memory_bytes"],
            **(
                {
                    k: gpu[k]
                    for k in (
                        "multiprocessors",
                        "l2_cache_bytes",
                        "shared_memory_per_block_optin",
                        "tf32_matmul",
                        "clocks",
                    )
                }
                if device.type == "cuda"
                else {}
            ),
        },
        "dtype": str(dtype).removeprefix("torch."),
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "cuda_runtime": gpu["cuda_runtime"],
            "cuda_driver": gpu["cuda_driver"],
            "cudnn": gpu["cudnn"],
            "triton": gpu["triton"],
            "transformers": _installed("transformers"),
            "posenc": __version__,
        },
        "git": {"commit": commit, "dirty": dirty},
        "package_sha256": source_sha256(),
        "benchmarked_sha256": benchmarked_sha256(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(
            timespec="seconds"
        ),
        "threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "load_average_start": load_average(),
    }
