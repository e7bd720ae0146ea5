"""Mutation testing of lmpipe's core modules with mutmut, one module at a time.

    python tools/mutation.py                 # all modules, one after the other
    python tools/mutation.py shards config   # some of them
    python tools/mutation.py --list          # the modules and the tests each is checked with
    python tools/mutation.py --survivors shards   # also print each surviving mutant's diff
    python tools/mutation.py --at d5a7836    # code and tests of a commit (the baseline)

mutmut 3 names a mutant after its file's path and matches it against the module the tests
import, so it must run where the package is a top-level folder (`lmpipe/`, not
`workflow/lmpipe/`). This script lays out such a folder, `build/mutation/<module>/`:
`workflow/lmpipe` moved to the top, `tests/` (only the module's fast tests run: never `slow`,
`slurm` or `gpu`), `workflow/`, `resources/`, `config/` and `Snakefile`; runs `mutmut run` in
it with PYTHONPATH on the mutated copy (a test's subprocess imports the mutants too); and prints,
per module: mutants, killed, survived (mutmut's "survived" plus "no tests": code no selected
test runs; "no test" counts those), timeout (each tested once more on its own first), and the
surviving share. A fresh copy every run:
the figures never come from a stale cache; each run's figures are kept in
`build/mutation/<module>-<commit or tree>.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORK = REPO / "build" / "mutation"

# module -> (its file under workflow/, the test files that check it; missing ones are skipped)
MODULES: dict[str, tuple[str, list[str]]] = {
    "shards": ("lmpipe/data/shards.py", ["test_data.py", "test_shards.py"]),
    "loader": ("lmpipe/data/loader.py", ["test_train.py", "test_prefetch.py", "test_loader.py"]),
    "checkpoint": ("lmpipe/train/checkpoint.py", ["test_train.py", "test_checkpoint.py"]),
    "config": (
        "lmpipe/config.py",
        ["test_config.py", "test_config_errors.py", "test_config_build.py"],
    ),
    "hellaswag": ("lmpipe/eval/hellaswag.py", ["test_evaluate.py", "test_hellaswag_scorer.py"]),
    "chat_data": ("lmpipe/chat/data.py", ["test_sft.py", "test_chat_data.py"]),
}
FAST = "not slow and not slurm and not gpu"
# Workers forked from a clean fork server instead of mutmut's own process (its default, "fork"):
# forked from the latter, the HellaSwag mutants whose tests build a model hung on a lock (one
# thread in futex_wait, no CPU) until their time limit. Not the default: on the other modules
# the fork server was 10x slower (11 s a mutant instead of 1).
ISOLATION = {"hellaswag": "forkserver"}

# mutmut's exit codes -> the columns of the table (lmpipe's reading of mutmut.stats)
KILLED = {1, 3}
SURVIVED = {0}
NO_TESTS = {5, 33}
TIMEOUT = {24, -24, 36, 152, 255}


COPIED = ["workflow", "tests", "resources", "config", "Snakefile"]  # what the tests read


def checkout(at: str | None, work: Path) -> None:
    """COPIED of the working tree, or of commit `at`, into `work`; lmpipe/ moved to the top."""
    if at is None:
        skip = shutil.ignore_patterns("__pycache__", "*.pyc")
        for name in COPIED:
            if (REPO / name).is_dir():
                shutil.copytree(REPO / name, work / name, ignore=skip)
            else:
                shutil.copy(REPO / name, work / name)
    else:
        tar = subprocess.run(
            ["git", "-C", str(REPO), "archive", at, *COPIED], check=True, capture_output=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(work)], input=tar, check=True)
    (work / "workflow" / "lmpipe").rename(work / "lmpipe")


def layout(name: str, at: str | None) -> Path:
    """build/mutation/<name>/: lmpipe/ at the top, the module's tests, mutmut's config."""
    source, test_files = MODULES[name]
    work = WORK / name
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    checkout(at, work)
    tests = [f for f in test_files if (work / "tests" / f).exists()]
    # lmpipe.paths.REPO_ROOT (mutants/lmpipe/paths.py, 2 up) is `work`; conftest's REPO
    # (mutants/tests/conftest.py, 1 up) is `work/mutants`, which mutmut fills by also_copy
    also_copy = [name for name in COPIED if name != "tests"]
    pyproject = REPO / "pyproject.toml"
    import tomllib

    markers = tomllib.loads(pyproject.read_text())["tool"]["pytest"]["ini_options"]["markers"]
    config = [
        "[tool.pytest.ini_options]",
        'testpaths = ["tests"]',
        f"markers = {json.dumps(markers)}",
        "",
        "[tool.mutmut]",
        'source_paths = ["lmpipe"]',
        f'only_mutate = ["{source}"]',
        f"also_copy = {json.dumps(also_copy)}",
        f"pytest_add_cli_args_test_selection = {json.dumps([f'tests/{f}' for f in tests])}",
        f'pytest_add_cli_args = ["-m", "{FAST}", "-p", "no:cacheprovider"]',
        "use_git_change_detection = false",
        # a mutant's time limit: (its tests' measured time + 20 s) x 3 (x 2 in CPU seconds).
        # mutmut measures a test's call, not its fixtures: a module fixture that trains a tiny
        # model for 10 s made mutmut's default (+1 s, x 15) stop surviving mutants as timeouts.
        f'process_isolation = "{ISOLATION.get(name, "fork")}"',
        "timeout_constant = 20.0",
        "timeout_multiplier = 3.0",
        "",
    ]
    (work / "pyproject.toml").write_text("\n".join(config))
    return work


def exit_codes(work: Path, source: str) -> dict[str, int | None]:
    meta = json.loads((work / "mutants" / (source + ".meta")).read_text())
    return meta["exit_code_by_key"]


def count(work: Path, source: str, uncovered: bool) -> dict[str, object]:
    codes = exit_codes(work, source)
    if uncovered:  # no selected test runs any of the module's code: every mutant lives
        codes = dict.fromkeys(codes, 33)
    killed = [k for k, c in codes.items() if c in KILLED]
    survived = [k for k, c in codes.items() if c in SURVIVED or c in NO_TESTS]
    timeout = [k for k, c in codes.items() if c in TIMEOUT]
    other = [k for k, c in codes.items() if k not in {*killed, *survived, *timeout}]
    return {
        "mutants": len(codes),
        "killed": len(killed),
        "survived": len(survived),
        "timeout": len(timeout),
        "no_tests": sum(1 for c in codes.values() if c in NO_TESTS),
        "other": len(other),
        "surviving_share": len(survived) / len(codes) if codes else 0.0,
        "survivor_names": sorted(survived),
        "other_names": sorted(other),
    }


def run(name: str, jobs: int, survivors: bool, at: str | None) -> dict[str, object]:
    source = MODULES[name][0]
    work = layout(name, at)
    # mutants/ must exist before Python starts: a PYTHONPATH entry that is missing then is
    # cached as absent, and `lmpipe` would be imported from wherever else it is installed
    (work / "mutants").mkdir()
    env = dict(os.environ)
    env["PYTHONPATH"] = str(work / "mutants")  # subprocesses import the mutated copy, not ours
    env.setdefault("OMP_NUM_THREADS", "1")
    mutmut = [sys.executable, "-m", "mutmut"]
    t0 = time.time()
    log = work / "mutmut.log"
    with open(log, "w") as f:
        proc = subprocess.run(
            [*mutmut, "run", "--max-children", str(jobs)], cwd=work, env=env, stdout=f, stderr=f
        )
    timeouts = [k for k, c in exit_codes(work, source).items() if c in TIMEOUT]
    if proc.returncode == 0 and timeouts:
        # a forked mutant now and then hangs (0 CPU) until its limit, and passes when run again
        # alone: each timeout is tested once more, on its own; one that hangs again stays one
        with open(log, "a") as f:
            for key in timeouts:
                subprocess.run([*mutmut, "run", key], cwd=work, env=env, stdout=f, stderr=f)
    seconds = time.time() - t0
    uncovered = "could not find any test case for any mutant" in log.read_text()
    if proc.returncode != 0 and not uncovered:
        raise RuntimeError(f"{name}: mutmut run failed ({proc.returncode}); see {log}")
    result = count(work, source, uncovered)
    result |= {"module": name, "file": source, "seconds": round(seconds)}
    (work / "result.json").write_text(json.dumps(result, indent=1))
    kept = WORK / f"{name}-{at or 'tree'}.json"  # survives the next run's fresh layout
    kept.write_text(json.dumps(result, indent=1))
    if survivors:
        for key in result["survivor_names"] + result["other_names"]:
            diff = subprocess.run(
                [*mutmut, "show", key], cwd=work, env=env, capture_output=True, text=True
            )
            print(f"## {key}\n{diff.stdout}")
    return result


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("modules", nargs="*", help=f"some of {', '.join(MODULES)} (default: all)")
    p.add_argument("--jobs", type=int, default=1, help="mutants tested at once (default 1)")
    p.add_argument("--survivors", action="store_true", help="print each survivor's diff")
    p.add_argument("--list", action="store_true", help="the modules and their tests")
    p.add_argument(
        "--at", metavar="COMMIT", help="code and tests of a commit (a baseline), not the tree's"
    )
    args = p.parse_args(argv)
    if args.list:
        for name, (source, tests) in MODULES.items():
            print(f"{name:11} workflow/{source:28} {' '.join(tests)}")
        return
    names = args.modules or list(MODULES)
    for name in names:
        if name not in MODULES:
            p.error(f"unknown module {name!r}; known: {', '.join(MODULES)}")
    header = f"{'module':11} {'mutants':>7} {'killed':>6} {'survived':>8} {'no test':>7}"
    header += f" {'timeout':>7}"
    rows = []
    failed = []
    for name in names:
        try:
            r = run(name, args.jobs, args.survivors, args.at)
        except RuntimeError as e:
            print(e, flush=True)
            failed.append(name)
            continue
        rows.append(
            f"{name:11} {r['mutants']:7d} {r['killed']:6d} {r['survived']:8d} {r['no_tests']:7d}"
            f" {r['timeout']:7d}"
            f" {r['surviving_share']:8.1%} {r['seconds']:6d} s"
            + (f"  ({r['other']} other: {', '.join(r['other_names'])})" if r["other"] else "")
        )
        print(rows[-1], flush=True)
    print()
    print(header + f" {'surviving':>8} {'time':>8}")
    print("\n".join(rows))
    if failed:
        sys.exit(f"failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
