"""Where a result came from: code version, packages, machine. Written beside each run's outputs."""

from __future__ import annotations

import platform
import socket
import subprocess
from datetime import UTC, datetime
from importlib import metadata

from lmpipe.paths import REPO_ROOT

PACKAGES = ("lmpipe", "torch", "numpy", "tiktoken", "transformers", "lm_eval", "snakemake")


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(REPO_ROOT), *args], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def package_versions(names: tuple[str, ...] = PACKAGES) -> dict[str, str]:
    """Installed versions of `names` ("not installed" for those missing)."""
    versions = {}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def gpu_names() -> list[str]:
    try:
        import torch
    except ImportError:
        return []
    if not torch.cuda.is_available():
        return []
    return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]


def collect() -> dict:
    """Git commit and dirtiness, package versions, host, Python, GPUs, time (UTC)."""
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {
        "git_commit": _git("rev-parse", "HEAD") or "unknown",
        "git_dirty": None if status is None else bool(status),
        "packages": package_versions(),
        "host": socket.gethostname(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "gpus": gpu_names(),
        "time_utc": datetime.now(UTC).isoformat(timespec="seconds"),
    }
