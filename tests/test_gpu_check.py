"""benchmarks/gpu_check.py --smoke: every part of the one-call GPU check, tiny, on the CPU.

GPU time is scarce and the check must work the first time it meets a GPU, so each of its parts
(tokenizing, the launcher's runs, the kill and resume, the conversion, gpu_train.py, the real
run and its loss curve) runs here at tiny sizes through the same code, and its JSON is checked.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import subprocess
import sys
import time

import pytest

from conftest import REPO

PARTS = [
    "env",
    "data",
    "correctness.first_step",
    "correctness.resume",
    "correctness.convert",
    "speed.tiny_mb2",
    "speed.tiny_mb2_fp8",
    "speed.tiny_mb2_chunked",
    "speed.tiny_mb2_blocks",
    "speed.tiny_mb2_model",
    "speed.tiny_mb2_model_reduce-overhead",
    "real_run",
    "speed.tiny_mb4",
]
CUDA_GRAPHS = "speed.tiny_mb2_model_reduce-overhead"  # skipped on the CPU, with the trainer's line


def benchmark(name: str):
    """A module of benchmarks/ (they import each other by their bare names)."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    return importlib.import_module(name)


@pytest.mark.slow
def test_gpu_check_smoke_runs_every_part(tmp_path):
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=str(REPO / "workflow"), PYTHONUNBUFFERED="1")
    env.pop("OUT", None)
    proc = subprocess.run(
        [sys.executable, "benchmarks/gpu_check.py", "--smoke", "--out", str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    report = json.loads((out / "gpu_check.json").read_text())
    parts = report["parts"]
    failed = {
        name: (p["status"], p.get("error"), p.get("traceback", "")[-1500:])
        for name, p in parts.items()
        if p["status"] != "ok" and name != CUDA_GRAPHS
    }
    assert not failed, f"{failed}\n{proc.stdout[-3000:]}"
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert list(parts) == PARTS
    assert report["mode"] == "smoke" and report["finished_utc"]

    # the comparisons are exact on one device
    first = parts["correctness.first_step"]["result"]
    assert first["train_loss_step1"]["rel_diff"] <= 1e-6
    assert first["val_loss_step0"]["rel_diff"] <= 1e-6
    resume = parts["correctness.resume"]["result"]
    assert resume["resumed_log_line"] and resume["resumed_vs_uninterrupted"]["bitwise"]
    convert = parts["correctness.convert"]["result"]
    assert convert["native_bitwise"] and not convert["llmc_unequal"]
    assert convert["hf_vs_checkpoint_max_abs_diff"] < 1e-4

    # one measurement a micro-batch size, each in its own process, with the kernels it ran
    for name in ("speed.tiny_mb2", "speed.tiny_mb2_fp8", "speed.tiny_mb2_chunked"):
        r = parts[name]["result"]
        assert r["tokens_per_s"] > 0 and 0 < r["mfu"] <= 1
        assert isinstance(r["attention_ops"], list) and r["attention_ops"]
        assert r["attention_kernel"] == "aten::_scaled_dot_product_flash_attention_for_cpu"
    # train.compile_scope reaches the trainer's model (the smoke run compiles nothing); CUDA
    # graphs are refused off CUDA with the trainer's own line
    scopes = [parts[f"speed.tiny_mb2{s}"]["result"]["compile_scope"] for s in ("", "_blocks")]
    assert scopes + [parts["speed.tiny_mb2_model"]["result"]["compile_scope"]] == [
        "regions", "blocks", "model"
    ]  # fmt: skip
    assert parts[CUDA_GRAPHS]["status"] == "skipped"
    assert parts[CUDA_GRAPHS]["reason"].startswith(
        "train.compile_mode 'reduce-overhead' captures CUDA graphs: launch.device cuda only"
    )
    assert parts["speed.tiny_mb4"]["result"]["tokens_per_s"] > 0
    # the trainer's own model: the chunked part's loss in chunks, the others' plain
    assert parts["speed.tiny_mb2_chunked"]["result"]["loss_chunk_tokens"] == 64
    assert parts["speed.tiny_mb2"]["result"]["loss_chunk_tokens"] == 0
    # train.fp8 reaches the trainer's model (torchao's emulation on the CPU)
    assert parts["speed.tiny_mb2_fp8"]["result"]["fp8"]
    assert not parts["speed.tiny_mb2"]["result"]["fp8"]
    speed = report["summary"]["speed"]
    assert [s["part"] for s in speed] == [
        "speed.tiny_mb2",
        "speed.tiny_mb2_fp8",
        "speed.tiny_mb2_chunked",
        "speed.tiny_mb2_blocks",
        "speed.tiny_mb2_model",
        "speed.tiny_mb4",
    ]
    assert [s["fp8"] for s in speed] == [False, True, False, False, False, False]

    real = parts["real_run"]["result"]
    assert real["steps_done"] == 10 and real["final_written"]
    assert real["last_loss"] < real["first_loss"]
    assert len(real["loss_curve"]) == 10
    csv = (out / "loss_curve.csv").read_text().splitlines()
    assert csv[0].startswith("step,tokens,loss,val_loss") and len(csv) == 1 + 10 + 3
    # what comes back from the device: a few files, none large
    files = sorted(p.name for p in out.iterdir())
    assert set(files) <= {"gpu_check.json", "gpu_check.log", "loss_curve.csv", "loss_curve.png"}
    assert all((out / f).stat().st_size < 16 * 2**20 for f in files)
    assert "correctness.resume: ok" in (out / "gpu_check.log").read_text()


def test_deadline_skips_parts_cleanly(tmp_path):
    """A deadline already passed: every part is skipped, the JSON still written, exit 0."""
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=str(REPO / "workflow"))
    proc = subprocess.run(
        [
            sys.executable,
            "benchmarks/gpu_check.py",
            "--smoke",
            "--deadline",
            "0",
            "--out",
            str(out),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    parts = json.loads((out / "gpu_check.json").read_text())["parts"]
    assert list(parts) == PARTS
    assert all(p["status"] == "skipped" for p in parts.values())
    assert "would exceed --deadline" in parts["env"]["reason"]


def test_the_device_plans_budgets_end_inside_the_deadline():
    """On the device, the default parts' budgets (the most each may take) sum to under the
    default --deadline, so the check ends inside it whatever happens; correctness runs first,
    then the 124m run's micro-batch compiled as the trainer compiles, in FP8 and with the loss in
    chunks, then the real run. The on-request compile trials (the blocks only, the whole model,
    the whole model in CUDA graphs) fit a second call, the fused loss kernels a third."""
    gpu_check = benchmark("gpu_check")
    plan = gpu_check.plan_for(smoke=False)
    parts = ["env", "data", "correctness.first_step", "correctness.resume", "correctness.convert"]
    parts += [s.name for s in plan.speed] + ["real_run"]
    assert set(plan.budgets) == set(parts)  # every part has its own budget, no default
    assert set(plan.on_request) < set(parts)
    default = [p for p in parts if p not in plan.on_request]
    assert sum(plan.budgets[p][1] for p in default) < gpu_check.DEFAULT_DEADLINE
    kernels = ["speed.d12_mb64_liger", "speed.d12_mb64_cut_cross_entropy"]
    trials = [p for p in plan.on_request if p not in kernels]
    assert len(trials) == 3 and set(kernels) < set(plan.on_request)
    for call in (trials, kernels):
        assert sum(plan.budgets[p][1] for p in ["env", "data", *call]) < gpu_check.DEFAULT_DEADLINE
    assert all(estimate <= budget for estimate, budget in plan.budgets.values())
    assert [s.name for s in plan.speed if s.name in default] == [
        "speed.d12_mb64", "speed.d12_mb64_fp8", "speed.d12_mb64_chunked",
    ]  # fmt: skip
    assert "real_run" in default


def test_the_fp8_part_is_skipped_where_torchao_is_absent(tmp_path):
    """The GPU image may lack torchao: the FP8 part says so and the check goes on (exit 0)."""
    out = tmp_path / "out"
    hide = (
        "import runpy, sys; sys.modules['torchao'] = None;"  # find_spec('torchao') is then None
        " sys.argv = ['gpu_check.py', *sys.argv[1:]];"
        " runpy.run_path('benchmarks/gpu_check.py', run_name='__main__')"
    )
    args = ["--smoke", "--parts", "speed.tiny_mb2_fp8", "--out", str(out)]
    env = dict(os.environ, PYTHONPATH=str(REPO / "workflow"))
    proc = subprocess.run(
        [sys.executable, "-c", hide, *args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    part = json.loads((out / "gpu_check.json").read_text())["parts"]["speed.tiny_mb2_fp8"]
    assert part == part | {"status": "skipped", "reason": "torchao not installed"}


def test_the_on_request_parts_wait_for_parts_to_name_them(tmp_path):
    """The device plan (nothing runs: the deadline has passed): the compile trials are skipped
    as on request, every other part for the deadline, in the plan's order."""
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=str(REPO / "workflow"))
    proc = subprocess.run(
        [sys.executable, "benchmarks/gpu_check.py", "--deadline", "0", "--out", str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    parts = json.loads((out / "gpu_check.json").read_text())["parts"]
    on_request = [
        "speed.d12_mb64_blocks", "speed.d12_mb64_model", "speed.d12_mb64_model_reduce-overhead",
        "speed.d12_mb64_liger", "speed.d12_mb64_cut_cross_entropy",
    ]  # fmt: skip
    assert list(parts)[5:] == [
        "speed.d12_mb64", "speed.d12_mb64_fp8", "speed.d12_mb64_chunked", *on_request, "real_run"
    ]  # fmt: skip
    for name, part in parts.items():
        why = "on request: name it in --parts" if name in on_request else "would exceed"
        assert part["status"] == "skipped" and part["reason"].startswith(why), (name, part)


def test_the_attention_timings_time_each_backend_on_its_own_kernel():
    """env's attention timings (which train.attention_backend to choose on the GPU): each
    backend the CPU has, timed, on the kernel that backend runs; the process's setting left as
    found (auto)."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import torch
    from gpu_train import attention_timings

    from lmpipe.models import attention

    timings = attention_timings(torch.device("cpu"), (2, 2, 64, 16), torch.float32, repeats=3)
    assert list(timings) == list(attention.CPU_BACKENDS)
    assert all(t["ms"] > 0 for t in timings.values())
    assert {name: t["kernel"] for name, t in timings.items()} == {
        "auto": "aten::_scaled_dot_product_flash_attention_for_cpu",
        "flash": "aten::_scaled_dot_product_flash_attention_for_cpu",
        "math": "aten::_scaled_dot_product_attention_math",
    }
    assert attention._chosen is None  # auto again


@pytest.mark.parametrize("smoke", [False, True], ids=["device", "smoke"])
def test_the_real_run_trains_at_the_first_speed_parts_shapes(smoke):
    """real_run's model, micro-batch, sequence, dtype and compile settings are the first speed
    part's, so that its step-0 validation and training graphs are the ones that part compiled
    (read back from the call's shared compile caches), not a second cold compile."""
    gpu_check, gpu_train = benchmark("gpu_check"), benchmark("gpu_train")
    plan = gpu_check.plan_for(smoke=smoke)
    first, train = plan.speed[0], plan.real_train
    args = dict(zip(plan.speed_args[::2], plan.speed_args[1::2], strict=False))
    assert plan.real_model == gpu_train.PRESETS[first.preset]
    assert (train.micro_batch, train.seq_len, train.dtype) == (
        first.mb, int(args["--seq-len"]), args["--dtype"]
    )  # fmt: skip
    assert (train.loss_chunk_tokens, train.fp8) == (first.chunk, first.fp8)
    assert (train.compile_scope, train.compile_mode) == (first.scope, first.mode)
    assert train.compile == ("--no-compile" not in plan.speed_args)
    assert dataclasses.asdict(train.fsdp) == dataclasses.asdict(type(train.fsdp)())
    assert train.activation_checkpointing == "none"


def make_check(tmp_path, **args):
    """A device-plan Check (nothing started: parts are called by hand)."""
    gpu_check = benchmark("gpu_check")
    defaults = dict(
        smoke=False, out=tmp_path / "out", work=tmp_path / "work", keep_work=False,
        deadline=gpu_check.DEFAULT_DEADLINE, parts=None,
    )  # fmt: skip
    return gpu_check.Check(argparse.Namespace(**(defaults | args)))


def test_a_part_that_cannot_run_gives_its_time_to_the_next(tmp_path):
    """The call's schedule: a part may use its budget and whatever the parts before it left
    (env finishing early, the FP8 part skipped where torchao is absent), never past the
    deadline; a part left out (on request) gives nothing."""
    check = make_check(tmp_path)
    allowed = {}

    def record(name):
        allowed[name] = check.part_end - time.monotonic()
        return {}

    check.part("env", lambda: record("env"))
    check.part("speed.d12_mb64_fp8", lambda: {}, skip_reason="torchao not installed")
    check.part("speed.d12_mb64_blocks", lambda: {})  # on request: not in this call
    check.part("speed.d12_mb64_chunked", lambda: record("chunked"))
    budgets = check.plan.budgets
    assert allowed["env"] == pytest.approx(budgets["env"][1], abs=1)
    expected = budgets["env"][1] + budgets["speed.d12_mb64_fp8"][1]
    expected += budgets["speed.d12_mb64_chunked"][1]
    assert allowed["chunked"] == pytest.approx(expected, abs=1)
    parts = check.report["parts"]
    assert parts["speed.d12_mb64_chunked"]["allowed_s"] == pytest.approx(expected, abs=1)
    assert parts["speed.d12_mb64_blocks"]["status"] == "skipped"

    short = make_check(tmp_path / "short", deadline=25.0)  # the deadline caps env's 30 s
    short.part("env", lambda: {"allowed": short.part_end - time.monotonic()})
    assert short.report["parts"]["env"]["result"]["allowed"] == pytest.approx(25, abs=1)


def test_every_process_of_a_call_shares_one_compile_cache(tmp_path, monkeypatch):
    """Inductor's and Triton's caches: one pair of directories under the call's scratch folder,
    in every subprocess's environment (torchrun's workers inherit it); a caller's own wins."""
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    check = make_check(tmp_path)
    a, b = check.env(), check.env(OMP_NUM_THREADS="2")
    for key in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
        assert a[key] == b[key] and a[key].startswith(str(tmp_path / "work"))
    assert a["TORCHINDUCTOR_CACHE_DIR"] != a["TRITON_CACHE_DIR"]
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "warm"))
    assert make_check(tmp_path / "again").env()["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "warm")


def test_a_fused_loss_kernel_part_runs_gpu_train_with_it_or_says_its_package_is_missing(
    tmp_path, monkeypatch
):
    """speed.d12_mb64_liger (on request): where liger-kernel is not installed, as here, skipped
    with the package to install; where it is, gpu_train.py runs with --loss-kernel liger."""
    gpu_check = benchmark("gpu_check")
    check = make_check(tmp_path, parts=["speed.d12_mb64_liger"])
    (liger,) = [s for s in check.plan.speed if s.name == "speed.d12_mb64_liger"]
    check.speed_part(liger)
    part = check.report["parts"]["speed.d12_mb64_liger"]
    assert part["status"] == "skipped"
    assert part["reason"].startswith("liger-kernel==0.8.5 not installed"), part
    commands = []
    monkeypatch.setattr(gpu_check, "kernel_missing", lambda kernel: None)
    monkeypatch.setattr(
        check, "run", lambda title, cmd, check=True: (commands.append(cmd), (1, ""))[1]
    )
    with pytest.raises(gpu_check.PartFailed):  # no result file; its command is what counts
        check.part_speed(liger)
    (cmd,) = commands
    assert cmd[cmd.index("--loss-kernel") + 1] == "liger"
