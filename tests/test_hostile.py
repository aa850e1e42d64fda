"""Hostile programs against the real sandbox: one property per test, then a health check.

Runtime containment is tested with `executor.run` directly (the static check is bypassed on purpose); the static
check's verdicts are tested separately at the end. CI runs as root; an ordinary user gets the same isolation
through a user namespace (tests/test_isolation.py runs the unprivileged path in CI), and the isolation tests here run
for either; the few that depend on runs having a uid of their own run as root only.
"""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time
import uuid

import pytest

from lorapop.executor import ExecutorConfig, SandboxExecutor
from lorapop.tasks import TASK_TYPES, Invalid, Proposal, Task
from lorapop.tasks.validity import check_program

ROOT = os.geteuid() == 0
# an ordinary user whose kernel allows user namespaces gets the same walls (lorapop/executor/sandbox.py)
ISOLATING = ROOT or subprocess.run(["unshare", "--user", "--map-root-user", "--net", "--mount", "--pid", "--fork",
                                    "true"], capture_output=True).returncode == 0
needs_root = pytest.mark.skipif(not ROOT, reason="runs get a uid of their own only as root (CI runs as root)")
needs_isolation = pytest.mark.skipif(not ISOLATING, reason="neither root nor user namespaces here")
SECRET = "lorapop-secret-" + uuid.uuid4().hex


@pytest.fixture(scope="module")
def ex():
    os.environ["LORAPOP_TEST_SECRET"] = SECRET  # set in the trainer before workers start
    e = SandboxExecutor(ExecutorConfig(timeout_s=1.0, n_workers=2, allow_unisolated=not ISOLATING, memory_mb=256))
    yield e
    e.close()
    os.environ.pop("LORAPOP_TEST_SECRET", None)


@pytest.fixture(scope="module")
def ex1():
    """One worker: consecutive runs are guaranteed to share it (cross-run tests); runs may fork (max_procs 4), so a
    leftover process can be made and must be gone."""
    e = SandboxExecutor(ExecutorConfig(timeout_s=1.0, n_workers=1, max_procs=4, allow_unisolated=not ISOLATING))
    yield e
    e.close()


def host_path(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("hostile") / f"victim-{uuid.uuid4().hex}")


# --- time and resources -------------------------------------------------------------------------------------------

def test_infinite_loop_times_out(ex):
    r = ex.run("while True:\n    pass")
    assert r.status == "timeout" and r.duration_s < 3


def test_sleep_past_limit_times_out(ex):
    r = ex.run("import time\ntime.sleep(30)\n_result = 1")
    assert r.status == "timeout" and r.duration_s < 3


def test_memory_bomb_hits_memory_limit(ex):
    r = ex.run("x = bytearray(2 * 1024 ** 3)\n_result = len(x)")
    assert r.status == "memory"


def test_growing_memory_bomb_hits_memory_limit(ex):
    r = ex.run("x = []\nwhile True:\n    x.append('a' * 10 ** 6)")
    assert r.status == "memory"


def test_deep_recursion_is_an_error(ex):
    r = ex.run("def g(n):\n    return g(n + 1)\n_result = g(0)")
    assert r.status == "error" and "RecursionError" in r.error


def test_unbounded_recursion_limit_does_not_return_ok(ex):
    r = ex.run("import sys\nsys.setrecursionlimit(10 ** 8)\ndef g(n):\n    return g(n + 1) + 1\n_result = g(0)")
    assert r.status in ("crashed", "memory", "error", "timeout") and r.value is None


@needs_isolation
def test_fork_bomb_is_contained(ex):
    code = "import os\nn = 0\nwhile True:\n    try:\n        os.fork()\n        n += 1\n    except OSError:\n        break\n_result = n"
    t0 = time.perf_counter()
    r = ex.run(code)
    assert time.perf_counter() - t0 < 5
    assert r.status in ("ok", "timeout", "error", "crashed")
    assert ex.run("_result = 6 * 7").value == "42"


def test_signal_tricks_do_not_escape_the_timeout(ex):
    code = ("import signal\nfor s in (signal.SIGTERM, signal.SIGINT, signal.SIGALRM, signal.SIGXCPU):\n"
            "    signal.signal(s, signal.SIG_IGN)\nwhile True:\n    pass")
    r = ex.run(code)
    assert r.status == "timeout"


def test_big_file_hits_file_size_limit(ex):
    r = ex.run("with open('big', 'wb') as fh:\n    fh.write(b'x' * (64 * 1024 * 1024))\n_result = 1")
    assert r.status in ("error", "memory") and r.value is None


# --- processes ----------------------------------------------------------------------------------------------------

@needs_isolation
def test_os_system_cannot_run_a_shell(ex, tmp_path_factory):
    target = host_path(tmp_path_factory)
    r = ex.run(f"import os\n_result = os.system('touch {target}')")
    assert r.status == "ok" and r.value != "0"
    assert not os.path.exists(target)


def test_subprocess_is_not_importable(ex):
    r = ex.run("import subprocess\n_result = subprocess.run(['id']).returncode")
    assert r.status == "error" and "ModuleNotFoundError" in r.error


@needs_root
def test_cannot_kill_its_parent(ex):
    """The worker is PID 1 of the run's pid namespace (a run has no getppid): SIGKILL to it is refused (another uid,
    as root) or dropped (the namespace's init), and the worker goes on serving."""
    r = ex.run("import os, signal\nos.kill(1, signal.SIGKILL)\n_result = 'alive'")
    assert (r.status == "error" and "PermissionError" in r.error) or (r.status, r.value) == ("ok", "'alive'"), r
    assert ex.run("_result = 1").value == "1"


@needs_isolation
def test_kill_everything_only_kills_itself(ex):
    r = ex.run("import os, signal\nos.kill(-1, signal.SIGKILL)\n_result = 'done'")
    # it may signal nothing but its own uid's processes in its own pid namespace: there are none but itself
    assert r.status == "error" and "ProcessLookupError" in r.error
    assert ex.run("_result = 2").value == "2"


def test_sys_exit_inside_f_is_an_error(ex):
    r = ex.run("import sys\ndef f():\n    sys.exit(0)\n_result = f()")
    assert r.status == "error" and r.error.startswith("SystemExit")


def test_os_exit_inside_f_is_a_crash(ex):
    r = ex.run("import os\ndef f():\n    os._exit(0)\n_result = f()")
    assert r.status == "crashed" and r.value is None


@needs_isolation
def test_leftover_process_is_gone_before_next_run(ex1):
    r = ex1.run("import os, time\npid = os.fork()\nif pid == 0:\n    os.setsid()\n    time.sleep(60)\n"
                "    os._exit(0)\n_result = pid")
    assert r.status == "ok"
    # a run may signal no single pid but 0, 1 and -1 (any other would tell it which pids exist): kill(-1, SIGKILL)
    # reaches every process of the namespace but the run and PID 1, and finds none when nothing was left
    assert int(r.value) > 1
    r2 = ex1.run("import os\ntry:\n    os.kill(-1, 9)\n    _result = 'alive'\nexcept ProcessLookupError:\n"
                 "    _result = 'gone'")
    assert r2.value == "'gone'"


@needs_root
def test_cannot_regain_root(ex):
    r = ex.run("import os\nos.setuid(0)\n_result = os.getuid()")
    assert r.status == "error" and "PermissionError" in r.error


@needs_isolation
def test_cannot_chroot_out(ex):
    r = ex.run("import os\nos.chroot('.')\n_result = 1")
    assert r.status == "error" and "PermissionError" in r.error


# --- files and environment ------------------------------------------------------------------------------------------

@needs_isolation
def test_write_outside_its_directory_is_blocked(ex, tmp_path_factory):
    target = host_path(tmp_path_factory)
    r = ex.run(f"with open({target!r}, 'w') as fh:\n    fh.write('pwned')\n_result = 1")
    assert r.status == "error"
    assert not os.path.exists(target)


@needs_isolation
def test_write_to_host_tmp_is_blocked(ex):
    name = f"/tmp/lorapop-hostile-{uuid.uuid4().hex}"
    r = ex.run(f"with open({name!r}, 'w') as fh:\n    fh.write('x')\n_result = 1")
    assert r.status == "error"
    assert not os.path.exists(name)


@needs_isolation
def test_delete_outside_its_directory_is_blocked(ex, tmp_path_factory):
    target = host_path(tmp_path_factory)
    with open(target, "w") as fh:
        fh.write("keep")
    r = ex.run(f"import os\nos.remove({target!r})\n_result = 1")
    assert r.status == "error"
    assert open(target).read() == "keep"


@needs_root
def test_parent_directory_is_not_writable(ex):
    """The run works in /w; the root above it is a read-only tmpfs."""
    r = ex.run("open('../escape', 'w').write('x')\n_result = 1")
    assert r.status == "error" and "Read-only file system" in r.error


@needs_isolation
def test_host_files_are_invisible(ex):
    r = ex.run("import os\n_result = (os.path.exists('/etc/passwd'), os.path.exists('/proc/1/environ'), "
               "sorted(os.listdir('/')))")
    assert r.value == "(False, False, ['w'])"


def test_trainer_environment_is_not_visible(ex):
    assert os.environ["LORAPOP_TEST_SECRET"] == SECRET
    r = ex.run("import os\n_result = repr(dict(os.environ))")
    assert r.status == "ok" and SECRET not in r.value and "LORAPOP_TEST_SECRET" not in r.value


@needs_isolation
def test_files_do_not_survive_into_the_next_run(ex1):
    """Runs see a read-only filesystem: nothing can be written for a later run to find (tests/test_channels.py tries
    every other way)."""
    r = ex1.run("open('note', 'w').write('x')\nimport os\n_result = os.listdir('.')")
    assert r.status == "error" and "Read-only file system" in r.error, r
    assert ex1.run("import os\n_result = os.listdir('.')").value == "[]"


# --- network ------------------------------------------------------------------------------------------------------

@needs_isolation
def test_socket_to_local_server_cannot_connect(ex):
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    srv.settimeout(1.5)
    port = srv.getsockname()[1]
    got = []

    def accept():
        try:
            got.append(srv.accept())
        except OSError:
            pass

    th = threading.Thread(target=accept)
    th.start()
    r = ex.run(f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=0.5)\n"
               "s.sendall(b'hi')\n_result = 'connected'")
    th.join()
    srv.close()
    assert r.status == "error" and r.value is None
    assert got == []


# --- output -------------------------------------------------------------------------------------------------------

def test_stdout_flood_hits_output_limit(ex):
    r = ex.run("while True:\n    print('x' * 1000)")
    assert r.status == "output_limit"


def test_raw_fd_writes_do_not_reach_the_trainer(ex):
    r = ex.run("import os\nfor fd in (1, 2):\n    try:\n        os.write(fd, b'garbage' * 1000)\n"
               "    except OSError:\n        pass\n_result = 'ok'")
    assert r.status == "ok" and r.value == "'ok'"


def test_enormous_return_value_hits_repr_limit(ex):
    r = ex.run("_result = list(range(10 ** 6))")
    assert r.status == "output_limit" and r.value is None


def test_unrepresentable_result_is_an_error(ex):
    r = ex.run("def f():\n    return [1, 2]\nclass Bad:\n    def __repr__(self):\n        raise ValueError('no')\n"
               "_result = Bad()")
    assert r.status == "error" and "ValueError" in r.error


# --- interpreter tricks ---------------------------------------------------------------------------------------------

def test_subclasses_escape_finds_nothing_usable(ex, tmp_path_factory):
    target = host_path(tmp_path_factory)
    code = ("names = [c.__name__ for c in ().__class__.__bases__[0].__subclasses__()]\n"
            "popen = [c for c in ().__class__.__bases__[0].__subclasses__() if c.__name__ == 'Popen']\n"
            "import os\n"
            f"rc = os.system('touch {target}')\n"
            "_result = (len(popen), rc == 0)")
    r = ex.run(code)
    assert r.status == "ok" and r.value == "(0, False)"
    assert not os.path.exists(target)


def test_dunder_import_and_importlib_cannot_load_new_modules(ex):
    r = ex.run("import importlib\nm = importlib.import_module('ctypes')\n_result = 1")
    assert r.status == "error" and ("ModuleNotFoundError" in r.error or "ImportError" in r.error)
    r = ex.run("_result = __import__('ctypes').CDLL(None)")
    assert r.status == "error"


def test_eval_and_exec_of_strings_stay_in_the_sandbox(ex):
    r = ex.run("exec(\"import os\\nimport socket\")\n_result = eval('1 + 1')")
    assert r.status == "ok" and r.value == "2"


def test_patched_builtins_do_not_leak_into_next_run(ex1):
    assert ex1.run("import builtins\nbuiltins.len = lambda x: 42\nbuiltins.repr = None\n_result = 0").status == "ok"
    assert ex1.run("_result = len([1, 2, 3])").value == "3"


def test_threads_left_behind_do_not_affect_next_run(ex1):
    code = ("import _thread, time, builtins\n"
            "def later():\n    time.sleep(0.05)\n    builtins.sorted = lambda x: 'hacked'\n"
            "_thread.start_new_thread(later, ())\n_result = 'started'")
    assert ex1.run(code).value == "'started'"
    time.sleep(0.1)
    assert ex1.run("import time\ntime.sleep(0.1)\n_result = sorted([3, 1, 2])").value == "[1, 2, 3]"


def test_hash_randomised_result_is_invalid(ex):
    prop = Proposal("code_o", "def f(words):\n    return list(set(words))",
                    [repr([f"word{i}" for i in range(30)])])
    res = TASK_TYPES["code_o"].validate(prop, ex)
    assert isinstance(res, Invalid) and res.reason == "nondeterministic"


def test_forged_code_f_answer_is_not_accepted(ex):
    task = Task("code_f", "def f(x):\n    return x * 2", [str(i) for i in range(10)],
                [str(2 * i) for i in range(10)], "double")
    forged = TASK_TYPES["code_f"].parse_answer(
        "```python\ndef f(x):\n    return type('A', (), {'__eq__': lambda s, o: True})()\n```")
    assert not TASK_TYPES["code_f"].check(task, forged, ex)


@pytest.mark.parametrize("src, reason", [
    ("import os\ndef f():\n    return os.system('id')", "banned_import"),
    ("def f():\n    return __import__('os')", "banned_name"),
    ("import importlib\ndef f():\n    return 1", "banned_import"),
    ("def f():\n    return ().__class__.__bases__[0].__subclasses__()", "dunder_access"),
    ("def f(s):\n    return eval(s)", "banned_name"),
    ("import ctypes\ndef f():\n    return 1", "banned_import"),
    ("from os import path\ndef f(p):\n    return path.exists(p)", "banned_import"),
    ("def f():\n    return open('/etc/passwd').read()", "banned_name"),
])
def test_static_check_rejects(src, reason):
    bad = check_program(src)
    assert bad is not None and bad.reason == reason


def test_zz_executor_still_healthy_and_fast(ex, ex1):
    for e in (ex, ex1):
        t0 = time.perf_counter()
        r = e.run("def f(a):\n    return a[::-1]\n_result = f('olleh')")
        assert r.status == "ok" and r.value == "'hello'"
        assert time.perf_counter() - t0 < 0.5
    rs = ex.run_many(["_result = %d" % i for i in range(50)])
    assert [r.value for r in rs] == [str(i) for i in range(50)]
