"""What a results file records about the run that made it: the commit, the processor, how busy the machine was."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent


def git(*args: str) -> str | None:
    """Output of a git command run from the package's folder; None outside a checkout or without git."""
    try:
        done = subprocess.run(["git", *args], cwd=HERE, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def git_state(scope: str | None = None) -> tuple[str | None, bool | None]:
    """(HEAD commit, whether there are uncommitted changes under `scope`, the whole checkout by default)."""
    status = git("status", "--porcelain", *(["--", scope] if scope else []))
    return git("rev-parse", "HEAD"), None if status is None else bool(status)


def cpu_model() -> str:
    """The processor's name where the system says it (Linux), else what platform knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def load_average() -> list[float] | None:
    """1, 5 and 15 minute load averages (timings depend on how busy the machine was), where the OS has them."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None
