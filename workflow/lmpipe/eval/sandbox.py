"""Run one untrusted Python program (model-generated code) and say whether its test passed.

The executor of a HumanEval-style evaluation: the program (prompt + completion) runs, then the
test, which defines `check(candidate)`, then `check(entry_point)`; the result is passed, failed,
timed out or error, with a short reason. Standard library only.

Anchored on OpenAI's human-eval (`human_eval/execution.py`: a `multiprocessing.Process` that
`exec`s the program in the evaluator's own interpreter under a SIGALRM timer, after
`reliability_guard()` sets `None` over `os.system`, `shutil.rmtree`, ...) and nanochat's
(`nanochat/execution.py`: a fresh interpreter a program, RLIMIT_AS, a temporary directory and
the same guard; its docstring says what it does not cover: the network, ctypes, no kernel
isolation). Both guards are Python assignments the program can undo. Here every limit is the
kernel's, set in the child between fork and exec (`_enter_sandbox`):

- a fresh interpreter (`sys.executable -I -S`), an empty environment, a temporary working
  directory of its own, removed afterwards; stdout and stderr into files the parent reads;
- rlimits: CPU seconds, address space (memory), file size, open files, processes;
- a new network namespace: no interface up, not even loopback, so no connection anywhere;
- a new mount namespace where every mount is read-only, nodev and nosuid (`mount_setattr`,
  recursively) except the working directory, and `/proc` is an empty tmpfs: the program
  writes nowhere else, opens no device (a raw disk included), reads no other process's /proc;
- a new PID namespace: the program is its PID 1, so when it ends, or the wall-clock timeout
  kills the process group, the kernel kills every process it left, `setsid` or not;
- then a nested user namespace, which leaves the program no capability over those namespaces
  (it cannot remount read-write, bring up loopback or mount /proc back);
- processes: RLIMIT_NPROC counts the processes of the child's real uid, and the kernel exempts
  uid 0 from it. Run as root (as here), the child stays uid 0 (the interpreter may live where
  only root reads, /root/.pyenv here), so a pids cgroup of its own (`pids.max`) holds the fork
  bomb; run as another user, the user namespace maps it to that user and RLIMIT_NPROC counts
  the processes of that user in the namespace: the sandbox's alone.

What it does not contain: the child reads every file its uid may read (as root: all of them),
though it can send nothing anywhere but its own stdout; CPU time beyond the wall-clock timeout
(bounded by RLIMIT_CPU, per process); no seccomp filter (every system call is allowed, within
the namespaces). Where a namespace cannot be made, `run_program` raises `SandboxUnavailable`
naming why, unless the caller passes `unsandboxed=True` (rlimits, directory and timeout only).
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import resource
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# <linux/sched.h>, <linux/mount.h>, <sys/mount.h>, <linux/prctl.h>
CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_NOSUID, MS_NODEV, MS_BIND, MS_REC, MS_PRIVATE = 0x2, 0x4, 0x1000, 0x4000, 0x40000
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID, MOUNT_ATTR_NODEV = 0x1, 0x2, 0x4
AT_FDCWD, AT_RECURSIVE = -100, 0x8000
SYS_MOUNT_SETATTR = 442  # the same number on every architecture (a syscall of Linux 5.12)
PR_SET_PDEATHSIG = 1

PASSED, FAILED, TIMED_OUT, ERROR = "passed", "failed", "timed out", "error"


class SandboxUnavailable(RuntimeError):
    """The machine cannot make the namespaces; the program was not run."""


@dataclasses.dataclass(frozen=True)
class Limits:
    timeout_s: float = 5.0  # wall clock, the whole process group killed after it
    cpu_s: int = 10  # RLIMIT_CPU, each process
    memory_bytes: int = 1 << 30  # RLIMIT_AS, each process
    file_bytes: int = 16 << 20  # RLIMIT_FSIZE: a file written, stdout included
    open_files: int = 64  # RLIMIT_NOFILE
    processes: int = 16  # pids.max, or RLIMIT_NPROC (see the module's docstring)
    output_chars: int = 2000  # the tail of stdout and stderr kept in the result


@dataclasses.dataclass(frozen=True)
class Result:
    status: str  # PASSED, FAILED, TIMED_OUT or ERROR
    reason: str  # one short line: the exception, the signal, the limit
    stdout: str = ""
    stderr: str = ""
    duration_s: float = 0.0

    @property
    def passed(self) -> bool:
        return self.status == PASSED


# Run by the child's interpreter (outside the PID namespace, whose first process is its fork):
# reads the nonce, forks the namespace's PID 1, which runs the program and then the test and
# prints the nonce only if both returned: a program that exits early (os._exit(0)) has not passed.
RUNNER = r"""
import ctypes, os, sys
nonce = sys.stdin.readline().strip()
sys.stdin.close()
alive, held = os.pipe()  # the runner holds `held` open while it lives
pid = os.fork()
if pid == 0:
    ctypes.CDLL(None).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL: die with the runner
    os.close(held)
    import select
    if select.select([alive], [], [], 0)[0]:  # end of file: the runner died before prctl
        os._exit(70)
    os.close(alive)
    source = open("program.py", encoding="utf-8").read()
    del pid
    code = compile(source, "program.py", "exec")
    namespace = {"__name__": "__main__"}
    try:
        exec(code, namespace)
    except BaseException as error:
        import traceback
        traceback.print_exc()
        sys.stderr.flush()
        line = f"{type(error).__name__}: {error}".splitlines()[0][:300]
        os.write(2, ("\n@@sandbox-failure@@" + line + "\n").encode())
        os._exit(1)
    sys.stdout.flush()
    os.write(1, ("\n" + nonce + "\n").encode())
    os._exit(0)
del nonce
_, status = os.waitpid(pid, 0)
if os.WIFSIGNALED(status):
    os.kill(os.getpid(), os.WTERMSIG(status))
os._exit(os.WEXITSTATUS(status))
"""
FAILURE_MARK = "@@sandbox-failure@@"


def humaneval_program(problem: dict, completion: str) -> tuple[str, str]:
    """A HumanEval problem and completion as run_program's program and test (human-eval's own
    concatenation: prompt + completion, the test, `check(entry_point)`)."""
    test = problem["test"] + "\n" + f"check({problem['entry_point']})\n"
    return problem["prompt"] + completion + "\n", test


def run_program(
    program: str, test: str = "", limits: Limits = Limits(), unsandboxed: bool = False
) -> Result:
    """Run `program` and then `test` in one fresh sandboxed interpreter; PASSED when both return.

    Raises SandboxUnavailable when the namespaces cannot be made here, unless `unsandboxed`:
    then the program runs with the rlimits, its own directory and the timeout only."""
    reason = isolation_unavailable()
    if reason is not None and not unsandboxed:
        raise SandboxUnavailable(f"cannot sandbox a program here: {reason}")
    isolate = reason is None
    workdir = Path(tempfile.mkdtemp(prefix="lmpipe-sandbox-"))
    cgroup = _make_pids_cgroup(limits.processes) if isolate and os.geteuid() == 0 else None
    if isolate and os.geteuid() == 0 and cgroup is None:
        shutil.rmtree(workdir)
        raise SandboxUnavailable(
            "cannot sandbox a program here: running as root, where RLIMIT_NPROC does not count, "
            "and no pids cgroup could be made (/sys/fs/cgroup)"
        )
    nonce = secrets.token_hex(16)
    try:
        (workdir / "program.py").write_text(program + "\n" + test, encoding="utf-8")
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            start = time.monotonic()
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", RUNNER],
                cwd=workdir,
                env={},
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=err,
                start_new_session=True,
                close_fds=True,
                preexec_fn=lambda: _enter_sandbox(str(workdir), limits, isolate, cgroup),
            )
            try:
                proc.stdin.write((nonce + "\n").encode())
                proc.stdin.close()
            except BrokenPipeError:
                pass
            timed_out = False
            try:
                proc.wait(timeout=limits.timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
            _kill(proc, cgroup)
            duration = time.monotonic() - start
            stdout, stderr = _tail(out, limits), _tail(err, limits)
        return _result(proc.returncode, timed_out, nonce, stdout, stderr, duration, limits)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        if cgroup is not None:
            _remove_cgroup(cgroup)


def _result(returncode, timed_out, nonce, stdout, stderr, duration, limits) -> Result:
    def made(status, reason):
        stdout_shown = stdout.replace(nonce, "").rstrip("\n")
        return Result(status, reason, stdout_shown, stderr, round(duration, 3))

    if timed_out:
        return made(TIMED_OUT, f"timed out after {limits.timeout_s:g} s (wall clock)")
    if returncode == 0 and nonce in stdout:
        return made(PASSED, "passed")
    if returncode == 0:
        return made(FAILED, "the program exited before its test finished")
    if returncode == 70:
        return made(ERROR, "the sandbox's runner lost its parent")
    if returncode < 0:
        number = -returncode
        name = signal.Signals(number).name if number in signal.valid_signals() else str(number)
        why = {"SIGXCPU": f" (CPU limit, {limits.cpu_s} s)", "SIGXFSZ": " (file size limit)"}
        return made(FAILED, f"killed by {name}{why.get(name, '')}")
    marks = [line for line in stderr.splitlines() if line.startswith(FAILURE_MARK)]
    if marks:
        return made(FAILED, marks[-1][len(FAILURE_MARK) :])
    return made(FAILED, f"exited with status {returncode}")


def _tail(file, limits: Limits) -> str:
    file.seek(0, os.SEEK_END)
    size = file.tell()
    file.seek(max(0, size - 4 * limits.output_chars))
    return file.read().decode("utf-8", "replace")[-limits.output_chars :]


def _kill(proc: subprocess.Popen, cgroup: Path | None) -> None:
    """Kill the process group (the runner, and so the PID namespace's first process and with it
    the namespace), then whatever the cgroup still holds."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
    if cgroup is not None:
        for _ in range(100):
            pids = (cgroup / "cgroup.procs").read_text().split()
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.01)


# ---- the child's side: everything below runs between fork and exec --------------------------


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _unshare(libc, flags: int, what: str) -> None:
    _check(libc.unshare(flags), f"unshare({what})")


def _mount(libc, source, target, fstype, flags, data=None) -> None:
    encode = lambda s: None if s is None else s.encode()  # noqa: E731
    _check(
        libc.mount(encode(source), encode(target), encode(fstype), ctypes.c_ulong(flags), data),
        f"mount {target}",
    )


class _MountAttr(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in ("attr_set", "attr_clr", "propagation", "userns")]


def _mount_setattr(libc, path: str, recursive: bool, set_: int = 0, clear: int = 0) -> None:
    attr = _MountAttr(set_, clear, 0, 0)
    flags = AT_RECURSIVE if recursive else 0
    result = libc.syscall(
        ctypes.c_long(SYS_MOUNT_SETATTR), ctypes.c_int(AT_FDCWD), path.encode(),
        ctypes.c_uint(flags), ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)),
    )  # fmt: skip
    _check(result, f"mount_setattr {path}")


def _write(path: str, text: str) -> None:
    try:
        fd = os.open(path, os.O_WRONLY)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)
    except OSError as error:
        raise OSError(error.errno, f"writing {text!r} to {path}: {error.strerror}") from None


def _enter_user_namespace(libc) -> None:
    """A user namespace whose uid and gid 0 are this process's own uid and gid."""
    uid, gid = os.geteuid(), os.getegid()
    _unshare(libc, CLONE_NEWUSER, "CLONE_NEWUSER")
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", f"0 {uid} 1")
    _write("/proc/self/gid_map", f"0 {gid} 1")


def _isolate(workdir: str, processes: int) -> None:
    libc = _libc()
    root = os.geteuid() == 0
    if not root:  # an unprivileged user gets its namespaces from a user namespace
        _enter_user_namespace(libc)
    _unshare(libc, CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID, "NEWNS|NEWNET|NEWPID")
    _mount(libc, None, "/", None, MS_REC | MS_PRIVATE)
    _mount(libc, "none", "/proc", "tmpfs", MS_NOSUID | MS_NODEV, b"size=4k,mode=555")
    _mount(libc, workdir, workdir, None, MS_BIND | MS_REC)
    locked = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOSUID
    _mount_setattr(libc, "/", recursive=True, set_=locked)
    _mount_setattr(libc, workdir, recursive=False, clear=MOUNT_ATTR_RDONLY)
    os.chdir(workdir)  # Popen's chdir came first: onto the directory under the bind mount
    # The last user namespace: no capability over the namespaces above (no remount, no network
    # configuration). Left unmapped (/proc is masked): the program sees uid 65534, the kernel
    # checks files against the same real uid as before.
    if root:  # (in the user namespace above, setgroups is denied)
        try:
            os.setgroups([])
        except OSError as error:
            raise OSError(error.errno, f"setgroups: {error.strerror}") from None
    _unshare(libc, CLONE_NEWUSER, "the last CLONE_NEWUSER")
    resource.setrlimit(resource.RLIMIT_NPROC, (processes, processes))


def _enter_sandbox(workdir: str, limits: Limits, isolate: bool, cgroup: Path | None) -> None:
    if cgroup is not None:
        _write(str(cgroup / "cgroup.procs"), "0")
    if isolate:
        _isolate(workdir, limits.processes)
    for limit, value in (
        (resource.RLIMIT_CPU, limits.cpu_s),
        (resource.RLIMIT_AS, limits.memory_bytes),
        (resource.RLIMIT_FSIZE, limits.file_bytes),
        (resource.RLIMIT_NOFILE, limits.open_files),
        (resource.RLIMIT_CORE, 0),
    ):
        resource.setrlimit(limit, (value, value))
    if not isolate:
        resource.setrlimit(resource.RLIMIT_NPROC, (limits.processes, limits.processes))


# ---- what this machine allows ----------------------------------------------------------------

_PROBED: dict[int, str | None] = {}


def isolation_unavailable() -> str | None:
    """None when the namespaces can be made here, else why not (probed once, in a fork)."""
    euid = os.geteuid()
    if euid not in _PROBED:
        _PROBED[euid] = _probe()
    return _PROBED[euid]


def _probe() -> str | None:
    if not sys.platform.startswith("linux"):
        return f"namespaces are Linux's, this is {sys.platform}"
    workdir = tempfile.mkdtemp(prefix="lmpipe-sandbox-probe-")
    read, write = os.pipe()
    try:
        pid = os.fork()
        if pid == 0:
            os.close(read)
            try:
                _isolate(workdir, 64)
                os.write(write, b"ok")
            except BaseException as error:  # noqa: BLE001 (reported to the parent)
                os.write(write, str(error).encode()[:500])
            os._exit(0)
        os.close(write)
        chunks = []
        while chunk := os.read(read, 1024):
            chunks.append(chunk)
        os.waitpid(pid, 0)
        answer = b"".join(chunks).decode(errors="replace")
        return None if answer == "ok" else (answer or "the probe died")
    finally:
        os.close(read)
        shutil.rmtree(workdir, ignore_errors=True)


def _make_pids_cgroup(processes: int) -> Path | None:
    """A pids cgroup of its own (v1's pids hierarchy, else the v2 one this process is in)."""
    roots = [Path("/sys/fs/cgroup/pids")]
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            if line.startswith("0::"):
                roots.append(Path("/sys/fs/cgroup") / line[3:].lstrip("/"))
    except OSError:
        pass
    for root in roots:
        if not (root / "cgroup.procs").exists():
            continue
        path = root / f"lmpipe-sandbox-{os.getpid()}-{secrets.token_hex(4)}"
        try:
            path.mkdir()
        except OSError:
            continue
        try:
            _write(str(path / "pids.max"), str(processes))
            return path
        except OSError:
            path.rmdir()
    return None


def _remove_cgroup(path: Path) -> None:
    for _ in range(200):
        try:
            path.rmdir()
            return
        except OSError:
            time.sleep(0.01)
