"""The CI guard (tests/no_skips_in_ci.py): a skip passes locally and fails under CI=true."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

SKIPPING = """
import shutil
import pytest

@pytest.mark.skipif(shutil.which("no-such-program") is None, reason="no-such-program is missing")
def test_needs_a_program():
    pass

def test_skips_inside():
    pytest.skip("no SLURM here")

@pytest.mark.xfail(reason="known")
def test_expected_failure():
    assert False
"""


@pytest.mark.parametrize("ci", ["", "true"])
def test_a_skip_fails_only_under_ci(pytester: pytest.Pytester, monkeypatch, ci: str) -> None:
    """Locally two skips and an xfail; under CI=true both skips fail, naming their reasons."""
    monkeypatch.setenv("CI", ci)
    pytester.makepyfile(SKIPPING)
    result = pytester.runpytest("-p", "no_skips_in_ci", "-rfE")
    if ci:
        # a skip at set-up (skipif) is reported as an error, one in the test as a failure
        result.assert_outcomes(errors=1, failed=1, xfailed=1)
        result.stdout.fnmatch_lines(
            ["*allows no skips: no-such-program is missing*", "*allows no skips: no SLURM here*"]
        )
    else:
        result.assert_outcomes(skipped=2, xfailed=1)
