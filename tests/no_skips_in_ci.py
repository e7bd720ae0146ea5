"""Under `CI=true` a skipped test fails: CI must not go green with SLURM or Chromium missing.

Locally a test skips with its reason where what it needs (root for SLURM, Chromium) is absent;
in CI `.ci/run` installs those, so a skip there means the installation broke and is reported as a
failure that carries the skip's reason.
"""

from __future__ import annotations

import os

import pytest


def skips_fail() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    if report.skipped and not hasattr(report, "wasxfail") and skips_fail():
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        reason = str(reason).removeprefix("Skipped: ")
        report.outcome = "failed"
        report.longrepr = f"skipped under CI=true, which allows no skips: {reason}"
    return report
