"""Run an untrusted Python program in a separate, isolated, resource-limited process.

Generated code never runs in the calling process. Each program runs as::

    caller --Popen--> unshare --exec--> waiter --fork--> init --fork--> program

(the three are this module's ``_sandbox_main``, run by ``sys.executable -I -S``: isolated mode,
no environment variables, user site or script directory on the path; no site packages, so only
the standard library imports).

* ``unshare`` (util-linux) makes new network, mount, PID, IPC and UTS namespaces (and, when the
  caller is not root, a user namespace). The environment is empty but for ``LANG`` and ``HOME``
  / ``TMPDIR`` (the program's own directory): nothing of the caller's environment is passed on.
* The waiter stays outside the PID namespace. It kills the init at the wall-clock limit (the
  whole namespace dies with its init) and reaps it, so no zombie is left to the machine's init.
* The init is process 1 of the PID namespace. As root of the namespaces it sets up the
  filesystem, then forks the program, reaps whatever is orphaned to it and reports the program's
  exit status and CPU time on a private pipe that the program closes before its first line, so
  an exit code or a printed line cannot pose as a sandbox failure. When it exits, the kernel
  kills everything left in the namespace.
* The program (process 2: it sees and can signal only its own descendants) applies its limits
  and drops its privileges before its first line:

  - network: a new namespace with no interface up, so even 127.0.0.1 is unreachable;
  - filesystem: every mount is remounted read-only and nosuid in its mount namespace; its working
    directory (a fresh ``tempfile.mkdtemp()`` path) is overmounted by a tmpfs of
    ``file_size_bytes``, the only writable place, which vanishes with the program. /proc is
    mounted fresh (it shows the namespace's processes only). When an ancestor of the interpreter's
    prefix is closed to other users (``/root/.pyenv``), a read-only tmpfs over that ancestor
    holds a bind mount of the prefix alone, so the standard library stays importable;
  - uid: when the caller is root the program runs as a random uid/gid in [10**9, 2*10**9) that no
    account owns, with no supplementary groups (a fresh uid per run, because RLIMIT_NPROC counts
    processes per uid: concurrent programs must not share one count); in a user namespace it
    drops all capabilities. ``no_new_privs`` keeps setuid binaries from raising privileges; its
    parent-death signal is SIGKILL.
  - rlimits: RLIMIT_CPU (soft = the limit: SIGXCPU, which ends the program and names the cause
    whatever the CPU accounting of a busy machine reports; hard = one second later: SIGKILL for
    a program that ignores SIGXCPU), and soft = hard for RLIMIT_AS, RLIMIT_NPROC,
    RLIMIT_FSIZE (SIGXFSZ is ignored, so a write past it fails with ``OSError``),
    RLIMIT_NOFILE, RLIMIT_CORE = 0.

  The caller kills the whole process group (SIGKILL to -pgid) once the run is over and, as a
  backstop, ``_BACKSTOP_SECONDS`` after the wall clock when the waiter has not ended by then.
* Defence in depth, not the boundary: an audit hook (:pep:`578`) installed before the program's
  first line refuses process creation and signals (``os.fork``, ``os.system``, ``os.exec*``,
  ``os.posix_spawn``, ``subprocess.Popen``, ``os.kill``), sockets' ``connect`` / ``bind`` /
  ``sendto`` and ``ctypes`` calls, so a program that tries gets a ``PermissionError`` naming the
  event instead of a stranger kernel error. ``run_python(..., audit_hook=False)`` leaves it out
  (the tests use that to check the kernel boundary alone).

Where namespaces are unavailable (no ``unshare``, or a kernel that refuses them), :func:`isolation`
falls back to what works: uid drop (root callers) + rlimits + audit hook, then rlimits + audit
hook. In the fallback the program shares the network and filesystem with the caller (its uid
limits what it can write: world-writable places such as /tmp remain writable), and descendants
that leave the process group can outlive it. :func:`isolation` says which mode is in force; it
probes once per process by running a small program in the strongest mode first.

Output is read with a cap: stdout and stderr keep their first and last ``output_bytes / 2``
bytes with a marker between (a traceback is at the end), however much the program writes.
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
import os
import random
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

_UID_RANGE = (10 ** 9, 2 * 10 ** 9)
_BACKSTOP_SECONDS = 2.0
"""The waiter kills the program at the wall clock; the caller kills the process group this much
later if the waiter has not ended by then (an overloaded machine, a waiter that hangs)."""
_GRACE_SECONDS = 1.0
"""After killing the process group: how long to wait for the pipes to close (at once in the
namespace mode; a fallback-mode descendant that left the group may hold them)."""
_READ_CHUNK = 1 << 16


@dataclasses.dataclass(frozen=True)
class Limits:
    """Resource limits of one program.

    ``cpu_seconds``: CPU time of each process (RLIMIT_CPU, whole seconds: SIGXCPU at the limit,
    SIGKILL one second later if the program ignores SIGXCPU).
    ``wall_seconds``: wall-clock time of the run; then the process group is killed.
    ``memory_bytes``: address space of each process (RLIMIT_AS).
    ``max_processes``: processes and threads of the program's uid (RLIMIT_NPROC; a fresh uid
    per run for root callers, else the caller's own, whose other processes count too).
    ``file_size_bytes``: size of any file it writes (RLIMIT_FSIZE) and, with the namespaces,
    of all its files together (its working directory's tmpfs).
    ``open_files``: file descriptors (RLIMIT_NOFILE).
    ``output_bytes``: how much of stdout and of stderr is kept (head and tail)."""
    cpu_seconds: int = 5
    wall_seconds: float = 10.0
    memory_bytes: int = 1 << 30
    max_processes: int = 16
    file_size_bytes: int = 16 << 20
    open_files: int = 64
    output_bytes: int = 64 << 10

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            kinds = (int, float) if field.name == "wall_seconds" else (int,)
            if isinstance(value, bool) or not isinstance(value, kinds) or not value > 0:
                kind = "number" if field.name == "wall_seconds" else "int"
                raise ValueError(f"Limits.{field.name} must be a positive {kind}, got {value!r}")
        if self.open_files < 16:   # the interpreter itself needs a few
            raise ValueError(f"Limits.open_files must be >= 16, got {self.open_files}")


@dataclasses.dataclass(frozen=True)
class Isolation:
    """What confines programs on this machine (see the module doc).

    ``namespaces``: own network (no interface up), mount (read-only filesystem but for the
    working directory), PID, IPC and UTS namespaces. ``user_namespace``: they are made in a user
    namespace (a caller that is not root). ``unprivileged``: the program runs with no privilege
    over the caller's files and processes: a fresh uid (root callers) or the capabilities of a
    user namespace dropped (other callers)."""
    namespaces: bool
    user_namespace: bool
    unprivileged: bool

    def __str__(self) -> str:
        parts = []
        if self.namespaces:
            parts.append("network, mount (read-only), PID, IPC and UTS namespaces"
                         + (" in a user namespace" if self.user_namespace else ""))
        if self.unprivileged:
            parts.append("no capabilities" if self.user_namespace else "a random unprivileged uid")
        return ", ".join(parts + ["rlimits", "audit hook"])


@dataclasses.dataclass(frozen=True)
class RunResult:
    """How a program ended.

    ``returncode``: its exit status, negative for the signal that killed it (SIGKILL when the wall
    clock ran out). ``stdout``, ``stderr``: decoded (invalid UTF-8 replaced), capped at
    ``Limits.output_bytes`` each with a ``[... N bytes omitted ...]`` marker. ``timed_out``: the
    wall-clock limit was hit. ``killed_by``: the signal's name or None. ``seconds``: wall time of
    the run; ``cpu_seconds``: CPU time of the program and the descendants it waited for (None when
    the run was killed before reporting)."""
    returncode: int
    stdout: str
    stderr: str
    timed_out: bool
    killed_by: str | None
    seconds: float
    cpu_seconds: float | None


class SandboxError(RuntimeError):
    """The sandbox itself failed to start a program (never the program's own failure)."""


def _sandbox_main(argv):
    """The waiter, the init and the program's setup; runs in the child interpreter, shipped as
    source (``-c``) so that it imports nothing of this package: it must be self-contained.
    ``argv``: ``key=value`` options from :func:`_command`. Status lines on the private pipe:
    ``setup-failed <why>`` or ``ready`` (the program's first line is next), then ``exit <code>
    <cpu>`` or ``signal <number> <cpu>`` (the init), then ``clock timeout|in-time`` (the
    waiter)."""
    import builtins
    import ctypes
    import os
    import resource
    import signal
    import sys

    opts = dict(arg.split("=", 1) for arg in argv)
    workdir, status = opts["workdir"], int(opts["status_fd"])
    namespaces, uid = opts["namespaces"] == "1", int(opts["uid"])
    libc = ctypes.CDLL(None, use_errno=True)
    PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS = 1, 4, 38
    # Not dumpable (inherited by the forks): a program with the same uid (a user namespace)
    # can neither ptrace the init nor reach its file descriptors through /proc.
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl")

    init = os.fork()
    if init:   # the waiter, outside the PID namespace: kill its init at the wall clock
        expired = []

        def expire(signum, frame):
            expired.append(signum)
            os.kill(init, signal.SIGKILL)   # the namespace's init: everything in it dies
        signal.signal(signal.SIGALRM, expire)
        signal.setitimer(signal.ITIMER_REAL, float(opts["wall"]))
        os.waitpid(init, 0)   # reaped here: no zombie is left to the machine's init
        signal.setitimer(signal.ITIMER_REAL, 0)
        os.write(status, f"clock {'timeout' if expired else 'in-time'}\n".encode())
        os._exit(0)

    # The init: process 1 of the PID namespace (signals the program sends itself, abort()
    # included, work as usual in process 2), root of the namespaces while it sets them up.
    try:
        def mount(source, target, fstype, flags, data=None):
            if libc.mount(source, os.fsencode(target), fstype, flags, data) != 0:
                errno = ctypes.get_errno()
                raise OSError(errno, f"mount {target!r}: {os.strerror(errno)}")

        MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND = 1, 2, 4, 8, 32, 4096
        keep = {b"nodev": MS_NODEV, b"noexec": MS_NOEXEC, b"noatime": 1024,
                b"nodiratime": 2048, b"relatime": 1 << 21}
        with open(os.path.join(workdir, "main.py"), "rb") as f:
            source = f.read()
        if namespaces:
            prefix = os.path.realpath(sys.base_prefix)
            parts = prefix.split("/")
            for i in range(1, len(parts)):
                ancestor = "/".join(parts[:i]) or "/"
                if uid >= 0 and not os.stat(ancestor).st_mode & 0o001:
                    # Closed to the program's uid (/root): show it the interpreter's prefix alone.
                    fd = os.open(prefix, os.O_PATH)
                    mount(b"tmpfs", ancestor, b"tmpfs", MS_NOSUID | MS_NODEV, b"size=64k,mode=0755")
                    os.makedirs(prefix)
                    mount(f"/proc/self/fd/{fd}".encode(), prefix, None, MS_BIND)
                    os.close(fd)
                    break
            with open("/proc/self/mountinfo", "rb") as f:
                mounts = [line.split() for line in f]
            for fields in mounts:
                point = fields[4]
                for code, char in ((b"\\040", b" "), (b"\\011", b"\t"), (b"\\012", b"\n"),
                                   (b"\\134", b"\\")):
                    point = point.replace(code, char)
                flags = MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID
                for option in fields[5].split(b","):
                    flags |= keep.get(option, 0)
                try:
                    mount(None, os.fsdecode(point), None, flags)
                except OSError as e:   # shadowed by a later mount: unreachable, nothing to protect
                    if e.errno not in (2, 22):   # ENOENT, EINVAL
                        raise
            mount(b"proc", "/proc", b"proc", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
            owner = f",uid={uid},gid={uid}" if uid >= 0 else ""
            mount(b"tmpfs", workdir, b"tmpfs", MS_NOSUID | MS_NODEV,
                  f"size={opts['file_size']},mode=0700{owner}".encode())
            with open(os.path.join(workdir, "main.py"), "wb") as f:   # tracebacks read it
                f.write(source)
            if uid >= 0:
                os.chown(os.path.join(workdir, "main.py"), uid, uid)
    except BaseException as e:
        os.write(status, f"setup-failed {type(e).__name__}: {e}\n".encode())
        os._exit(1)

    program = os.fork()
    if program:   # the init: reap whatever is orphaned to it until the program ends
        while True:
            pid, wait_status, usage = os.wait4(-1, 0)
            if pid == program:
                break
        cpu = usage.ru_utime + usage.ru_stime
        if os.WIFSIGNALED(wait_status):
            end = f"signal {os.WTERMSIG(wait_status)}"
        else:
            end = f"exit {os.waitstatus_to_exitcode(wait_status)}"
        os.write(status, f"{end} {cpu:.3f}\n".encode())
        os._exit(0)   # with the PID namespace, the kernel kills what the program left behind

    # The program: limits, then no privileges, then its code.
    try:
        os.chdir(workdir)
        # SIGXCPU at the CPU limit (the cause is then unambiguous: rusage's CPU time can read a
        # few percent under the kernel's own count on a busy machine), SIGKILL a second later.
        resource.setrlimit(resource.RLIMIT_CPU, (int(opts["cpu"]), int(opts["cpu"]) + 1))
        for name, key in (("RLIMIT_AS", "memory"), ("RLIMIT_NPROC", "processes"),
                          ("RLIMIT_FSIZE", "file_size"), ("RLIMIT_NOFILE", "open_files")):
            resource.setrlimit(getattr(resource, name), (int(opts[key]), int(opts[key])))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        signal.signal(signal.SIGXCPU, signal.SIG_DFL)   # whatever the caller's disposition
        if uid >= 0:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
        elif namespaces:   # root of a user namespace: drop its capabilities (no undoing the mounts)
            header = (ctypes.c_uint32 * 2)(0x20080522, 0)   # _LINUX_CAPABILITY_VERSION_3, self
            if libc.capset(header, (ctypes.c_uint32 * 6)()) != 0:
                raise OSError(ctypes.get_errno(), "capset")
        # After the uid change, which clears the parent-death signal.
        if (libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                or libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0):
            raise OSError(ctypes.get_errno(), "prctl")
    except BaseException as e:
        os.write(status, f"setup-failed {type(e).__name__}: {e}\n".encode())
        os._exit(1)
    os.write(status, b"ready\n")
    os.close(status)
    del libc, mount

    if opts["audit"] == "1":
        blocked = frozenset((
            "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty",
            "subprocess.Popen", "os.kill", "os.killpg", "signal.pthread_kill",
            "socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg",
            "ctypes.dlopen", "ctypes.dlsym", "ctypes.call_function"))

        def hook(event, args):
            if event in blocked:
                raise PermissionError(f"sandbox: {event} is not allowed")
        sys.addaudithook(hook)

    # -S leaves out site, which would add exit() and quit(): programs use them.
    builtins.exit = builtins.quit = sys.exit
    module = type(sys)("__main__")
    module.__file__ = "main.py"
    module.__builtins__ = builtins
    sys.modules["__main__"] = module
    sys.argv = ["main.py"]
    try:
        exec(compile(source, "main.py", "exec", dont_inherit=True), module.__dict__)
    except SystemExit:
        raise
    except BaseException as e:   # the program's traceback, without this frame
        e = e.with_traceback(e.__traceback__.tb_next)
        sys.excepthook(type(e), e, e.__traceback__)
        sys.exit(1)


_CHILD_SOURCE = (textwrap.dedent(inspect.getsource(_sandbox_main))
                 + "\n_sandbox_main(__import__('sys').argv[1:])\n")


def _command(mode: Isolation, *, workdir: str, status_fd: int, uid: int, limits: Limits,
             audit_hook: bool) -> list[str]:
    prefix = []
    if mode.namespaces:
        prefix = [shutil.which("unshare") or "unshare", "--net", "--mount", "--pid", "--ipc",
                  "--uts", "--propagation", "private"]
        if mode.user_namespace:
            prefix += ["--user", "--map-root-user"]
    options = {"workdir": workdir, "status_fd": status_fd, "namespaces": int(mode.namespaces),
               "uid": uid, "audit": int(audit_hook), "wall": limits.wall_seconds,
               "cpu": limits.cpu_seconds,
               "memory": limits.memory_bytes, "processes": limits.max_processes,
               "file_size": limits.file_size_bytes, "open_files": limits.open_files}
    return prefix + [sys.executable, "-I", "-S", "-c", _CHILD_SOURCE,
                     *(f"{k}={v}" for k, v in options.items())]


class _Capped:
    """The first and last ``cap / 2`` bytes of a stream, and how long it was."""

    def __init__(self, cap: int):
        self.keep_tail = cap // 2
        self.keep_head = cap - self.keep_tail
        self.head, self.tail, self.total = bytearray(), bytearray(), 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.keep_head - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        self.tail += chunk
        if len(self.tail) > 2 * self.keep_tail + _READ_CHUNK:   # trim now and then, not per chunk
            del self.tail[:len(self.tail) - self.keep_tail]

    def text(self) -> str:
        tail = self.tail[len(self.tail) - min(self.keep_tail, len(self.tail)):]
        omitted = self.total - len(self.head) - len(tail)
        middle = f"\n[... {omitted} bytes omitted ...]\n".encode() if omitted else b""
        return bytes(self.head + middle + tail).decode("utf-8", "replace")


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _collect(proc: subprocess.Popen, *, deadline: float, cap: int) -> tuple[str, str, bool]:
    """Read stdout and stderr until both close, capped; kill the group at ``deadline``."""
    streams = {proc.stdout: _Capped(cap), proc.stderr: _Capped(cap)}
    timed_out = False
    with selectors.DefaultSelector() as selector:
        for stream in streams:
            selector.register(stream, selectors.EVENT_READ)
        while selector.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                if timed_out:   # grace over: a stray fallback-mode descendant holds the pipes
                    break
                timed_out = True
                _kill_group(proc.pid)
                deadline = time.monotonic() + _GRACE_SECONDS
                continue
            for key, _ in selector.select(remaining):
                chunk = os.read(key.fd, _READ_CHUNK)
                if chunk:
                    streams[key.fileobj].add(chunk)
                else:
                    selector.unregister(key.fileobj)
    return streams[proc.stdout].text(), streams[proc.stderr].text(), timed_out


def _execute(mode: Isolation, source: str, *, limits: Limits, stdin: str,
             audit_hook: bool) -> RunResult:
    workdir = tempfile.mkdtemp(prefix="hindsight-sandbox-")
    try:
        with open(os.path.join(workdir, "main.py"), "w", encoding="utf-8") as f:
            f.write(source)
        with open(os.path.join(workdir, "stdin"), "w", encoding="utf-8") as f:
            f.write(stdin)
        fresh_uid = mode.unprivileged and not mode.user_namespace
        uid = random.SystemRandom().randrange(*_UID_RANGE) if fresh_uid else -1
        if uid >= 0 and not mode.namespaces:   # the program writes into the host directory
            os.chown(workdir, uid, uid)
        status_read, status_write = os.pipe()
        try:
            command = _command(mode, workdir=workdir, status_fd=status_write, uid=uid,
                               limits=limits, audit_hook=audit_hook)
            env = {"LANG": "C.UTF-8", "HOME": workdir, "TMPDIR": workdir}
            start = time.monotonic()
            with open(os.path.join(workdir, "stdin"), "rb") as stdin_file:
                try:
                    proc = subprocess.Popen(command, stdin=stdin_file, stdout=subprocess.PIPE,
                                            stderr=subprocess.PIPE, env=env, cwd=workdir,
                                            start_new_session=True, pass_fds=(status_write,))
                finally:
                    os.close(status_write)
            with proc:
                try:
                    deadline = start + limits.wall_seconds + _BACKSTOP_SECONDS
                    stdout, stderr, timed_out = _collect(proc, deadline=deadline,
                                                         cap=limits.output_bytes)
                finally:
                    _kill_group(proc.pid)   # leftovers (fallback mode); the waiter is a zombie
                    proc.wait()
            seconds = time.monotonic() - start
            os.set_blocking(status_read, False)
            try:
                report = os.read(status_read, 1 << 16).decode("utf-8", "replace")
            except BlockingIOError:
                report = ""
        finally:
            os.close(status_read)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    # A setup failure is the first line or none: later lines may come from the program
    # (a same-uid program in the fallback mode could write to the pipe through /proc).
    lines = report.splitlines()
    if lines and lines[0].startswith("setup-failed "):
        raise SandboxError(f"sandbox setup failed ({mode}): {lines[0][len('setup-failed '):]}")
    timed_out = timed_out or "clock timeout" in lines
    if "ready" not in lines and not timed_out:
        raise SandboxError(f"sandbox did not start ({mode}), exit status {proc.returncode}: "
                           f"{stderr[-500:]}")
    ends = [line.split() for line in lines if line.startswith(("exit ", "signal "))]
    if ends:
        kind, number, cpu = ends[-1]
        returncode = int(number) if kind == "exit" else -int(number)
        cpu_seconds = float(cpu)
    else:   # killed with its namespace's init (the wall clock) before the init could report
        returncode, cpu_seconds = -signal.SIGKILL, None
    killed_by = signal.Signals(-returncode).name if returncode < 0 else None
    return RunResult(returncode=returncode, stdout=stdout, stderr=stderr, timed_out=timed_out,
                     killed_by=killed_by, seconds=seconds, cpu_seconds=cpu_seconds)


_PROBE = "import json, math\nprint(json.dumps(math.isqrt(49)))\n"


@functools.cache
def isolation() -> Isolation:
    """The strongest isolation that works here: the first mode in which a probe program runs."""
    root = os.geteuid() == 0
    candidates = []
    if shutil.which("unshare"):
        candidates.append(Isolation(namespaces=True, user_namespace=not root, unprivileged=True))
    if root:
        candidates.append(Isolation(namespaces=False, user_namespace=False, unprivileged=True))
    candidates.append(Isolation(namespaces=False, user_namespace=False, unprivileged=False))
    probe_limits = Limits(wall_seconds=30.0)
    for mode in candidates[:-1]:
        try:
            result = _execute(mode, _PROBE, limits=probe_limits, stdin="", audit_hook=True)
        except SandboxError:
            continue
        if result.returncode == 0 and result.stdout == "7\n":
            return mode
    return candidates[-1]


def run_python(source: str, *, limits: Limits = Limits(), stdin: str = "",
               audit_hook: bool = True) -> RunResult:
    """Run ``source`` as a Python program in the sandbox (see the module doc) and say how it
    ended. ``stdin`` is its standard input. ``audit_hook=False`` leaves out the audit hook (the
    kernel's confinement alone: tests). Raises :class:`SandboxError` only when the sandbox itself
    fails, never for anything the program does."""
    if not isinstance(source, str):
        raise TypeError(f"`source` must be a str, got {type(source).__name__}")
    if not isinstance(stdin, str):
        raise TypeError(f"`stdin` must be a str, got {type(stdin).__name__}")
    if not isinstance(limits, Limits):
        raise TypeError(f"`limits` must be a Limits, got {type(limits).__name__}")
    return _execute(isolation(), source, limits=limits, stdin=stdin, audit_hook=audit_hook)
