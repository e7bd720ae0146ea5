"""The sandbox of model-generated code (lmpipe.eval.sandbox): each planted program is a
HumanEval-style problem whose check passes only if the attack worked, so a contained attack is
scored a failure, and the test then checks the machine (the decoy, the server, the processes).
"""

from __future__ import annotations

import os
import socket
import textwrap
from pathlib import Path

import pytest

from lmpipe.eval import sandbox
from lmpipe.eval.sandbox import FAILED, PASSED, TIMED_OUT, Limits, run_program

FAST = Limits(timeout_s=3.0)


def problem(prompt: str, entry_point: str, test: str) -> dict:
    return {"prompt": textwrap.dedent(prompt), "entry_point": entry_point, "test": test}


ADD = problem(
    '''
    def add(a: int, b: int) -> int:
        """The sum of a and b."""
    ''',
    "add",
    "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0\n",
)


def run_humaneval(prob: dict, completion: str, limits: Limits = FAST) -> sandbox.Result:
    program, test = sandbox.humaneval_program(prob, completion)
    return run_program(program, test, limits)


def attack(body: str, limits: Limits = FAST) -> sandbox.Result:
    """`body` as the completion of `def candidate():`, checked to have returned True."""
    prob = problem("import os\n\ndef attack():\n", "attack", "def check(c):\n    assert c()\n")
    return run_humaneval(prob, textwrap.indent(textwrap.dedent(body), "    "), limits)


def test_the_machine_allows_the_sandbox():
    assert sandbox.isolation_unavailable() is None


def test_a_correct_completion_passes_and_a_wrong_one_fails():
    right = run_humaneval(ADD, "    return a + b\n")
    assert right.status == PASSED, right
    wrong = run_humaneval(ADD, "    return a - b\n")
    assert wrong.status == FAILED and wrong.reason.startswith("AssertionError"), wrong
    early = run_humaneval(ADD, "    return a + b\n__import__('os')._exit(0)\n")
    assert early.status == FAILED and "exited before" in early.reason, early


def test_an_infinite_loop_times_out():
    result = attack("while True:\n    pass\n", Limits(timeout_s=1.0))
    assert result.status == TIMED_OUT, result
    assert result.duration_s < 3


def _sandbox_processes() -> int:
    """Processes running the sandbox's runner (its text is on their command line)."""
    count = 0
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and sandbox.FAILURE_MARK.encode() in (
                (entry / "cmdline").read_bytes()
            ):
                count += 1
        except OSError:
            pass
    return count


def test_a_fork_bomb_is_limited_and_leaves_no_process():
    body = """
    import time
    for _ in range(200):
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
    return True
    """
    result = attack(body)
    assert result.status == FAILED and "BlockingIOError" in result.reason, result
    assert _sandbox_processes() == 0


def test_a_10_gb_allocation_fails():
    result = attack("return len(bytearray(10 * 2**30)) > 0\n")
    assert result.status == FAILED and "MemoryError" in result.reason, result


def test_no_connection_leaves_the_sandbox():
    server = socket.create_server(("127.0.0.1", 0))
    server.setblocking(False)
    port = server.getsockname()[1]
    try:
        for address in (("1.1.1.1", 80), ("127.0.0.1", port)):
            body = f"import socket\nsocket.create_connection({address!r}, timeout=2)\nreturn True\n"
            result = attack(body)
            assert result.status == FAILED and "OSError" in result.reason, (address, result)
        with pytest.raises(BlockingIOError):
            server.accept()
    finally:
        server.close()


def _decoy(tmp_path: Path) -> tuple[Path, dict]:
    decoy = tmp_path / "decoy"
    decoy.mkdir()
    (decoy / "keep.txt").write_text("precious\n")
    return decoy, _state(decoy)


def _state(decoy: Path) -> dict:
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(decoy.iterdir())}


def test_writing_outside_its_directory_fails(tmp_path):
    decoy, before = _decoy(tmp_path)
    body = f"""
    open({str(decoy / "new.txt")!r}, "w").write("planted")
    open({str(decoy / "keep.txt")!r}, "w").write("overwritten")
    open("its_own.txt", "w").write("fine")  # its own directory is writable
    return True
    """
    result = attack(body)
    assert result.status == FAILED and "Read-only file system" in result.reason, result
    assert _state(decoy) == before
    mine = attack("open('its_own.txt', 'w').write('fine')\nreturn open('its_own.txt').read()\n")
    assert mine.status == PASSED, mine


def test_rm_rf_of_a_decoy_leaves_it(tmp_path):
    decoy, before = _decoy(tmp_path)
    result = attack(f"os.system('rm -rf {decoy}')\nreturn not os.path.exists({str(decoy)!r})\n")
    assert result.status == FAILED, result
    assert _state(decoy) == before


def test_refuses_without_namespaces_unless_told(monkeypatch):
    monkeypatch.setitem(sandbox._PROBED, os.geteuid(), "unshare: Operation not permitted")
    with pytest.raises(sandbox.SandboxUnavailable, match="Operation not permitted"):
        run_program("print(1)")
    result = run_program("print(1)", unsandboxed=True)
    assert result.status == PASSED and result.stdout == "1", result


def test_a_process_that_leaves_its_session_is_killed_too():
    body = """
    import time
    if os.fork() == 0:
        os.setsid()  # out of the process group the timeout kills
        time.sleep(60)
        os._exit(0)
    return True
    """
    assert attack(body).status == PASSED
    assert _sandbox_processes() == 0
