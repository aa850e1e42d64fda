"""The sandbox holds for root and for an ordinary user (user namespaces), with the seccomp filter on both paths.

The hostile programs live in tests/sandbox_probe.py and go through the trainer's entry points (parse_proposal, then
validation, then the runs). The root path runs them in this process (CI runs as root); the unprivileged path runs
the same probe as uid 65534 with every capability gone (tests/unprivileged.py: setpriv, with the
interpreter and the checkout bind-mounted where that uid can read them; CI's interpreter may sit under /root). Here, on the host side,
a secret file, a directory anyone may write, a TCP listener on 127.0.0.1 and a unix socket wait for what must not
arrive.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import tempfile
import threading
import uuid
from pathlib import Path

import pytest

from lorapop.executor import ExecutorConfig, IsolationError, SandboxExecutor
from lorapop.executor.lockdown import Unsupported, install_seccomp, machine

sys.path.insert(0, str(Path(__file__).parent))
import sandbox_probe  # noqa: E402
import unprivileged  # noqa: E402  (a script of the checkout as uid 65534)

ROOT = os.geteuid() == 0


class Host:
    """What a program must not reach: files, a TCP listener, a unix socket. Counts the connections it gets."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="lorapop-isolation-"))
        os.chmod(self.dir, 0o755)
        self.secret = "lorapop-secret-" + uuid.uuid4().hex
        self.secret_file = self.dir / "secret.txt"
        self.secret_file.write_text(f"text/{self.secret} {self.secret}\n")
        os.chmod(self.secret_file, 0o644)
        self.drop = self.dir / "drop"
        self.drop.mkdir()
        os.chmod(self.drop, 0o777)  # so only the sandbox, not file modes, keeps an unprivileged program out
        self.connections: list[str] = []
        self.tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.tcp.bind(("127.0.0.1", 0))
        self.tcp.listen(8)
        self.unix_path = str(self.dir / "host.sock")
        self.unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.unix.bind(self.unix_path)
        os.chmod(self.unix_path, 0o777)
        self.unix.listen(8)
        self.threads = [threading.Thread(target=self._accept, args=(s, n), daemon=True)
                        for s, n in ((self.tcp, "tcp"), (self.unix, "unix"))]
        for t in self.threads:
            t.start()

    def _accept(self, srv: socket.socket, name: str) -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            self.connections.append(name)
            conn.close()

    def spec(self) -> dict:
        return {"secret_file": str(self.secret_file), "drop_dir": str(self.drop),
                "tcp_port": self.tcp.getsockname()[1], "unix_socket": self.unix_path}

    def close(self) -> None:
        for s in (self.tcp, self.unix):
            s.close()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def host():
    h = Host()
    yield h
    h.close()


def check(out: dict, host: Host) -> None:
    """What must hold on either path."""
    assert "refused" not in out, out["refused"]
    p = out["protections"]
    assert all(p[k] for k in ("network_isolated", "filesystem_isolated", "pid_namespace", "unprivileged", "seccomp"))
    assert all(out["static_ok"].values()), out["static_ok"]  # every program reached the sandbox
    assert host.secret not in json.dumps(out), "a host file's content came back"
    assert sorted(os.listdir(host.drop)) == [], "a program wrote on the host"
    assert host.connections == [], f"a program connected to the host: {host.connections}"
    # as configured (kin modules not importable), then with them preloaded so they meet the namespaces and filter
    assert out["preloaded"] == {"kin": None}, out["preloaded"]
    for props in (out["proposals"], out["proposals_preloaded"]):
        for name in ("codecs_write", "xml_sax_url", "pydoc_pager_shell", "io_write", "wave_write", "nntplib_tcp",
                     "socket_tcp", "socket_unix", "posix_execv", "posix_spawn"):
            assert not props[name]["valid"], (name, props[name])
        for name in ("socket_tcp", "socket_unix", "posix_execv", "posix_spawn"):  # the filter, inside the program
            assert "PermissionError" in (props[name]["detail"] or ""), (name, props[name])
        # os.system's child cannot exec a shell: 127 << 8, a "valid" task whose output says no shell ran
        assert props["posix_system"]["outputs"] in (None, ["32512"]), props["posix_system"]
    pre = out["proposals_preloaded"]
    assert not any("ModuleNotFoundError" in (r["detail"] or "") for r in pre.values()), pre
    for name in ("xml_sax_url", "pydoc_pager_shell", "nntplib_tcp"):  # urlopen's socket, the pager's exec: filter
        assert "Operation not permitted" in pre[name]["detail"], (name, pre[name])
    assert out["leftover"][0] == "ok" and out["leftover_after"] == "'gone'", out
    assert out["fork"] == "7"
    status, n, took, limit = out["fork_bomb"]
    assert status == "ok" and 0 < int(n) < limit and took < 3, out["fork_bomb"]  # RLIMIT_NPROC stopped it
    (sig, _, sig_err), (cut, _, cut_err), (last, _, _) = out["at_worker"]
    assert sig == "ok" or "PermissionError" in sig_err, out["at_worker"]  # delivered and ignored, or refused
    assert cut == "error" and "PermissionError" in cut_err, out["at_worker"]  # the filter: prlimit on another pid
    assert last == "ok", out["at_worker"]  # the same worker still serves (a dead one would give "crashed")
    # no signal but SIGKILL can be sent at all (the filter), so a run queues none against the user's budget
    assert out["sigqueue"][0] == "error" and "PermissionError" in out["sigqueue"][2], out["sigqueue"]
    status, value, error = out["syscalls"]
    assert status == "ok", error
    got = eval(value)  # a dict of ints, repr'd by the sandbox
    want = {name: sandbox_probe.EXPECTED_ERRNO.get(name, 1) for name in sandbox_probe.SYSCALLS[machine()]}
    assert got == want, {k: (got.get(k), v) for k, v in want.items() if got.get(k) != v}


@pytest.mark.skipif(not ROOT, reason="the root path needs root (CI runs as root)")
def test_root_path_holds(host):
    out = sandbox_probe.probe(host.spec())
    assert out["protections"]["mechanism"] == "root"
    check(out, host)


def run_unprivileged(spec: dict) -> dict:
    r = unprivileged.run("tests/sandbox_probe.py", [json.dumps(spec)], timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_unprivileged_path_holds(host):
    if ROOT and shutil.which("setpriv") is None:
        pytest.skip("needs setpriv (util-linux)")
    out = run_unprivileged(host.spec())
    assert out["uid"] != 0
    if not ROOT and "refused" in out:  # an ordinary user on a kernel without user namespaces: refused, not silent
        assert "executor.allow_unisolated" in out["refused"]
        pytest.skip(f"user namespaces unavailable here: {out['refused'][:200]}")
    assert out["protections"]["mechanism"] == "userns", out.get("protections") or out.get("refused")
    check(out, host)


def test_probe_sees_the_leaks_of_an_unisolated_sandbox(host):
    """Control: the same probe, unprivileged, with every layer turned off (the opt-out), does get the secret, write
    on the host and connect to it - so the assertions above can fail."""
    # a long clock: os.system starts a shell, which on a loaded machine took longer than the probe's one second;
    # room for many processes: without namespaces the runs share the uid's count with every process of that uid on
    # the machine (another test's sandbox as uid 65534 included), so the probe's 4 could leave no room for the shell
    off = {"isolate_network": False, "isolate_filesystem": False, "isolate_pids": False, "seccomp": False,
           "allow_unisolated": True, "timeout_s": 20.0, "max_procs": 256}
    out = run_unprivileged(dict(host.spec(), executor=off, proposals_only=True))
    assert out["protections"]["mechanism"] == "none"
    assert host.secret in json.dumps(out["proposals"])
    assert {"codecs_write", "io_write", "wave_write", "posix_system"} <= set(os.listdir(host.drop))
    assert {"tcp", "unix"} <= set(host.connections)


def test_seccomp_filter_alone():
    """The filter by itself, in a forked child of this process: each refused call gets EPERM (clone3 ENOSYS),
    where the same call without the filter does not fail with EPERM (so the filter is what refused it)."""
    try:
        arch = machine()
    except Unsupported as exc:
        pytest.skip(str(exc))
    ns: dict = {}

    def calls() -> dict:
        exec(sandbox_probe.syscall_program(arch), ns)  # the probe's own program, outside any sandbox
        return ns["_result"]

    def in_child(filtered: bool) -> dict:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(r)
                if filtered:
                    install_seccomp()
                os.write(w, json.dumps(calls()).encode())
            finally:
                os._exit(0)
        os.close(w)
        with os.fdopen(r) as fh:
            data = fh.read()
        os.waitpid(pid, 0)
        return json.loads(data)

    unfiltered, filtered = in_child(False), in_child(True)
    want = {name: sandbox_probe.EXPECTED_ERRNO.get(name, 1) for name in sandbox_probe.SYSCALLS[arch]}
    assert filtered == want, {k: (filtered.get(k), v) for k, v in want.items() if filtered.get(k) != v}
    # without the filter these are not EPERM even for root (those that need a capability would be, for others)
    for name in ("unshare", "setns", "socket", "socketpair", "execve", "chroot", "clone", "clone3", "prlimit64",
                 "process_vm_readv", "ptrace", "bpf", "shmget", "memfd_create", "setpriority", "sched_setaffinity",
                 "set_tid_address", "timer_create", "futex_trylock_pi", "futex_lock_pi_private", "getuid",
                 "getresuid", "getgroups", "adjtimex", "eventfd2", "membarrier", "preadv2",
                 "prctl_get_securebits", "prctl_get_timerslack", "seccomp", "setfsuid", "set_mempolicy",
                 "statx_mnt_id", "openat_noatime", "statx_plain", "quotactl", "quotactl_fd", "getxattr",
                 "listxattr", "clone_pidfd", "fcntl_setfl_noatime"):
        assert unfiltered[name] != 1, (name, unfiltered[name])


def test_fork_and_threads_still_work_under_the_filter():
    """With max_procs above 1 (the default refuses both: tests/test_executor.py)."""
    with SandboxExecutor(ExecutorConfig(timeout_s=2.0, n_workers=1, max_procs=4)) as ex:
        assert ex.protections["seccomp"]
        assert ex.run(sandbox_probe.FORK).value == "7"
        r = ex.run("import _thread, time\nout = []\n_thread.start_new_thread(out.append, (5,))\n"
                   "time.sleep(0.05)\n_result = out")
        assert r.value == "[5]", r


def test_no_isolation_is_refused_unless_allowed(monkeypatch):
    """Neither root's namespaces nor user namespaces (here: no util-linux unshare to make them): refused with an
    error naming what is missing and the opt-out; with the opt-out it runs, says so, and is not `isolated`."""
    from lorapop.executor.base import isolated

    monkeypatch.setenv("PATH", "/nonexistent-lorapop")
    with pytest.raises(IsolationError, match=r"unshare.*executor\.allow_unisolated: true"):
        SandboxExecutor(ExecutorConfig(n_workers=1))
    with pytest.warns(RuntimeWarning, match="NOT ISOLATED"):
        ex = SandboxExecutor(ExecutorConfig(n_workers=1, allow_unisolated=True))
    try:
        p = ex.protections
        assert p["mechanism"] == "none" and not isolated(p) and p["seccomp"]
        assert ex.run("_result = 1").value == "1"
    finally:
        ex.close()
    with pytest.raises(IsolationError, match="require_isolation"):
        SandboxExecutor(ExecutorConfig(n_workers=1, allow_unisolated=True, require_isolation=True))


TINY = ["--selfplay.task_types=[code_o]", "--selfplay.tasks_per_type=2", "--selfplay.n_solve=2",
        "--selfplay.n_references=1", "--engine.device=cpu", "--run.progress=none", "--selfplay.seed_files=[]"]


def test_lorapop_train_refuses_without_isolation(tmp_path, monkeypatch, capsys):
    """The CLI stops before any model loads, with what is missing and the opt-out."""
    from lorapop.cli import main

    monkeypatch.setenv("PATH", "/nonexistent-lorapop")  # no util-linux unshare: neither root's nor a user's namespaces
    rc = main(["train", *TINY, f"--run.output_dir={tmp_path}", "--run.name=refused"])
    err = capsys.readouterr().err
    assert rc == 2 and "unshare" in err and "executor.allow_unisolated: true" in err, err


@pytest.mark.slow
def test_an_unisolated_run_says_so_and_records_it(tmp_path, monkeypatch):
    """With the opt-out the run starts, its start shows the warning, population.json and the report record it."""
    from lorapop.config import load_config
    from lorapop.report.html import build_html
    from lorapop.records.run_data import load_run
    from lorapop.train.loop import Trainer

    monkeypatch.setenv("PATH", "/nonexistent-lorapop")
    cfg = load_config(None, TINY + ["--executor.allow_unisolated=true", "--run.steps=1",
                                    f"--run.output_dir={tmp_path}", "--run.name=open"])
    said: list[str] = []
    monkeypatch.setattr("lorapop.train.logger.Progress.message", lambda self, line: said.append(line))
    with pytest.warns(RuntimeWarning, match="NOT ISOLATED"), Trainer(cfg, tmp_path / "open") as trainer:
        trainer.write_population()
    assert any("NOT ISOLATED" in line and "executor.allow_unisolated" in line for line in said), said
    pop = json.loads((tmp_path / "open" / "population.json").read_text())
    assert pop["sandbox"]["isolated"] is False and pop["sandbox"]["mechanism"] == "none"
    assert "sandbox NOT ISOLATED" in build_html([load_run(tmp_path / "open")], [])


def test_a_namespace_setup_that_fails_at_start_is_refused_unless_allowed():
    """The worker's namespaced start fails (here: a tmpfs size the kernel rejects), as it does where user namespaces
    are refused: an error with the worker's own message, or, with the opt-out, a warning and no namespaces."""
    with SandboxExecutor(ExecutorConfig(n_workers=1, disk_mb=-1)) as ex:
        with pytest.raises(IsolationError, match=r"namespaces refused \(sandbox worker failed to start: .*mount"):
            ex.run("_result = 1")  # the first run starts the first worker
    with SandboxExecutor(ExecutorConfig(n_workers=1, disk_mb=-1, allow_unisolated=True)) as ex:
        with pytest.warns(RuntimeWarning, match="namespaces refused"):
            p = ex.protections
        assert p["mechanism"] == "none" and not p["network_isolated"]
        assert ex.run("_result = 2").value == "2"


def test_a_refused_sandbox_stays_refused():
    """Asking again after an IsolationError does not find a worker left running unchecked."""
    with SandboxExecutor(ExecutorConfig(n_workers=1, disk_mb=-1)) as ex:
        for _ in range(2):
            with pytest.raises(IsolationError):
                ex.run("_result = 1")
        assert all(w.proc is None for w in ex._all)


@pytest.mark.skipif(machine() != "x86_64" and machine() != "aarch64", reason="prctl through _ctypes, as the worker")
def test_a_run_that_changed_its_uid_is_made_not_dumpable_again():
    """ambient.nondumpable, which every run that drops to its own uid calls (the kernel resets the flag to the
    machine's fs.suid_dumpable then, 2 where apport is installed; 0 here would hide a broken call): from a dumpable
    process it leaves one that is not, with no _ctypes module left behind."""
    import _ctypes
    import ctypes

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lorapop" / "executor"))
    import ambient

    libc = ctypes.CDLL(None)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            libc.prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE 1
            before = libc.prctl(3, 0, 0, 0, 0)  # PR_GET_DUMPABLE
            sys.modules.pop("_ctypes", None)
            ambient.nondumpable(_ctypes.__file__)
            os.write(w, repr((before, libc.prctl(3, 0, 0, 0, 0), "_ctypes" in sys.modules)).encode())
        finally:
            os._exit(0)
    os.close(w)
    got = os.read(r, 100)
    os.close(r)
    os.waitpid(pid, 0)
    assert got == b"(1, 0, False)", got
