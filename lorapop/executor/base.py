"""What the rest of lorapop sees of the sandbox: the Executor Protocol, its config (ExecutorConfig), a run's result
(ExecResult), the error raised where programs cannot be isolated, and the test of whether a run is walled off.
Torch-free and process-free: :mod:`.sandbox` implements it, :mod:`.ray_executor` spreads it over Ray actors."""

from __future__ import annotations

import errno
import random
import select
from dataclasses import dataclass
from typing import Protocol

from lorapop.configlib import ConfigError, check_fields, doc

WORKER_DIED = "worker died"  # ExecResult.error of a run whose worker process ended under it
ESCALATED = "escalated"  # a lean worker's run that imported what its worker lacks: the executor runs it again
RUN_STATUSES = ("ok", "error", "memory", "output_limit", "crashed")  # what a child may report of itself

DEFAULT_PRELOAD = (
    "re", "math", "cmath", "collections", "collections.abc", "itertools", "functools", "heapq", "bisect", "string",
    "fractions", "decimal", "operator", "copy", "typing", "dataclasses", "enum", "array",
    "numbers", "unicodedata", "textwrap", "json", "__future__",
)  # the codecs: preload_codecs (kept compiled, so that a package's attributes are a script's before their import)
LEAN_PRELOAD = (
    "re", "math", "collections", "collections.abc", "itertools", "functools", "heapq", "bisect", "string",
    "operator", "copy", "typing", "__future__",
)  # what most programs import: the seeds' imports and the usual helpers of function-style code


@dataclass
class ExecutorConfig:
    n_workers: int = doc(2, "worker processes per hash seed (parallel runs); with lean_preload, as many lean "
                            "and as many full ones", ge=1)
    timeout_s: float = doc(5.0, "default wall-clock limit per run, seconds; a task's validation runs must end "
                                "within half of it (every check runs it again: lorapop/tasks/common.py)", gt=0)
    memory_mb: int = doc(512, "address-space limit per run (RLIMIT_AS), MiB, "
                              "interpreter included; 0 = none", ge=0)
    disk_mb: int = doc(64, "size of each worker's private tmpfs, MiB (the runs' root "
                           "filesystem, read-only to them: no run can write a file)", ge=1)
    fsize_mb: int = doc(4, "largest file a run may write (RLIMIT_FSIZE), MiB", ge=0)
    max_procs: int = doc(1, "processes and threads a run may have at once, itself "
                            "included (RLIMIT_NPROC); 1: no fork and no thread, so "
                            "memory_mb bounds every byte a run holds (each extra "
                            "process may take memory_mb more)", ge=1)
    max_open_files: int = doc(64, "open file descriptors per run (RLIMIT_NOFILE)", ge=1)
    max_output_chars: int = doc(100_000, "stdout+stderr chars before status "
                                         "output_limit; output is discarded", ge=1)
    max_repr_chars: int = doc(400, "longest repr(_result) returned (400 = the task "
                                   "output limit); longer gives output_limit", ge=1)
    isolate_network: bool = doc(True, "network namespace (unshare --net)")
    isolate_filesystem: bool = doc(True, "mount namespace + private tmpfs + chroot")
    isolate_pids: bool = doc(True, "pid namespace: runs cannot see or signal other "
                                   "processes; leftovers are killed after each run")
    drop_privileges: bool = doc(True, "run programs without privileges: under an "
                                      "unprivileged uid as root, with every capability "
                                      "dropped in a user namespace")
    uid_base: int | None = doc(None, "as root: first uid for runs (one per worker); "
                                     "None draws one at random for each worker process")
    seccomp: bool = doc(True, "syscall filter on every run (namespaces, mount, ptrace, "
                              "bpf, sockets, exec... fail with EPERM; "
                              "lorapop/executor/lockdown.py)")
    allow_unisolated: bool = doc(False, "run model-written programs even where this "
                                        "machine gives the sandbox no isolation (neither "
                                        "root nor unprivileged user namespaces, or no "
                                        "seccomp): they can then read your files and "
                                        "reach the network; warned at every start and "
                                        "recorded in population.json and the report")
    require_isolation: bool = doc(False, "refuse any missing protection, even with "
                                         "allow_unisolated")
    hashseeds: tuple[int, ...] = doc((), "three distinct PYTHONHASHSEEDs (1 to 2**32-1), one pool of n_workers "
                                         "workers each: validation runs a task under the first two, a check runs "
                                         "each input once under each (lorapop/tasks/common.py); empty draws three "
                                         "at random when the executor starts, so no program can be fitted to them")
    worker_max_runs: int = doc(2000, "runs a worker serves before a fresh one replaces it: whatever one worker "
                                     "process holds for its whole life (its memory layout, so the address bits "
                                     "of id(); its filesystem's device number) is the same in all its runs, a key "
                                     "a program could learn to use; a fresh worker draws them anew", ge=1)
    default_hashseed: int | None = doc(None, "PYTHONHASHSEED for runs that do not name one (the eval judges); "
                                             "None: the first of hashseeds", ge=1, le=2**32 - 1)
    grace_s: float = doc(5.0, "extra seconds the trainer waits for a worker before "
                              "replacing it", ge=0)
    python: str | None = doc(None, "interpreter for workers (default: this one)")
    preload: tuple[str, ...] = doc(DEFAULT_PRELOAD, "stdlib modules importable by "
                                                    "programs (nothing else is)")
    preload_codecs: bool = doc(True, "also every codec module of the standard library (encodings.*) importable, so "
                                     "that str.encode and bytes.decode know every codec plain Python knows (a codec "
                                     "the sandbox lacked failed there alone); kept compiled in the worker and "
                                     "executed by the run that uses one (lorapop/executor/stored.py)")
    lean_preload: tuple[str, ...] = doc(LEAN_PRELOAD, "the modules of the lean workers every run tries first (those "
                                        "of them in preload: a lean worker never holds what a full one lacks; no "
                                        "codecs): a run that imports anything its lean "
                                        "worker lacks (a codec's module included) is run again from its start on a "
                                        "worker with all of preload and the codecs, and only that run counts. A "
                                        "smaller worker forks and exits faster (each run copies its page tables and "
                                        "tears them down): 5-8% of a validated task's time. Empty: every "
                                        "run on the full workers (docs/METHOD.md, \"The sandbox\")")
    ray: bool = doc(False, "run validation and checking jobs on Ray executor actors "
                         "(any node of engine.ray_address's cluster, or a local Ray), "
                         "each wrapping this same sandbox with every protection above; "
                         "needs `.venv/bin/pip install -e '.[ray]'` (lorapop/executor/ray_executor.py)")
    ray_actors: int = doc(2, "with ray: executor actors; a batch is split across them, "
                             "each runs its share on its own n_workers sandbox workers", ge=1)
    ray_num_cpus: float = doc(1.0, "with ray: CPUs Ray reserves per executor actor "
                                   "(where it places them; the sandbox itself runs "
                                   "n_workers processes)", ge=0)

    def validate(self) -> None:
        check_fields(self, "executor")
        seeds = tuple(self.hashseeds)
        if seeds and (len(seeds) != N_HASHSEEDS or len(set(seeds)) != N_HASHSEEDS
                      or not all(isinstance(x, int) and 1 <= x < 2**32 for x in seeds)):
            raise ConfigError(f"executor.hashseeds = {list(seeds)}: give {N_HASHSEEDS} distinct integers from 1 to "
                              f"{2**32 - 1}, or none to draw them at random")


N_HASHSEEDS = 3  # validation's two, and a third only checks use: a hash order must agree under all three


def resolve_hashseeds(config: ExecutorConfig) -> tuple[int, ...]:
    """The config's seeds, or three distinct ones drawn from the operating system's randomness (never 0, which
    turns hash randomisation off)."""
    if config.hashseeds:
        config.validate()
        return tuple(int(x) for x in config.hashseeds)
    rng, seeds = random.SystemRandom(), []
    while len(seeds) < N_HASHSEEDS:
        x = rng.randrange(1, 2**32)
        if x not in seeds:
            seeds.append(x)
    return tuple(seeds)


@dataclass
class ExecResult:
    status: str  # "ok" | "error" | "timeout" | "memory" | "output_limit" | "crashed"
    value: str | None  # repr of `_result` when ok (a program that sets none gives "None")
    error: str | None  # short "Type: message", never a trainer traceback
    duration_s: float

    @property
    def ok(self) -> bool:
        return self.status == "ok"


class Executor(Protocol):
    """``hashseeds``: the executor's three PYTHONHASHSEEDs (:func:`resolve_hashseeds`), which validation and checks
    name in their calls; a run that names none runs under ``config.default_hashseed`` or the first of them.
    ``max_result_chars``: this call's cap on ``repr(_result)``, below the config's ``max_repr_chars`` (a judge
    that knows how long a right answer can be): a longer result is ``output_limit`` and is never read past the cap,
    so a forged one costs the host no more than the caller allows."""

    hashseeds: tuple[int, ...]

    def run(self, code: str, *, timeout_s: float | None = None, hashseed: int | None = None,
            max_result_chars: int | None = None) -> ExecResult: ...

    def run_many(self, codes: list[str], *, timeout_s: float | None = None, hashseed: int | None = None,
                 max_result_chars: int | None = None) -> list[ExecResult]: ...

    def close(self) -> None: ...


# what isolated() requires of SandboxExecutor.protections
ISOLATION_KEYS = ("network_isolated", "filesystem_isolated", "pid_namespace", "unprivileged", "seccomp")


class IsolationError(RuntimeError):
    """The sandbox cannot isolate programs here and executor.allow_unisolated does not allow running anyway."""


def isolated(protections: dict) -> bool:
    """Whether a run is walled off from the host: its own network, files and pids, no privileges, the filter."""
    return all(bool(protections.get(k)) for k in ISOLATION_KEYS)


_READABLE = select.POLLIN | select.POLLPRI | select.POLLHUP | select.POLLERR
_WRITABLE = select.POLLOUT | select.POLLHUP | select.POLLERR


def ready(reads: list, writes: list, timeout: float) -> tuple[list, list]:
    """``select.select(reads, writes, [], timeout)``'s two lists, through ``poll``: select refuses any descriptor past
    1,023, and a trainer holding that many files (an engine, Ray) had every run come back crashed. Items are
    descriptors or objects with ``fileno()``; an ended or broken one counts as ready, as select counts it."""
    poller, items = select.poll(), {}
    for obj, flags, side in [(o, select.POLLIN | select.POLLPRI, 0) for o in reads] + \
            [(o, select.POLLOUT, 1) for o in writes]:
        fd = obj if isinstance(obj, int) else obj.fileno()
        entry = items.setdefault(fd, [0, None, None])
        entry[0] |= flags
        entry[1 + side] = obj
        poller.register(fd, entry[0])
    if timeout != timeout:
        raise ValueError("timeout is NaN")
    r, w = [], []
    for fd, events in poller.poll(min(max(0.0, timeout) * 1000, 2 ** 31 - 1)):  # poll takes at most 2**31-1 ms
        if events & select.POLLNVAL:  # a closed descriptor: select raises, and a poll loop would spin to its clock
            raise OSError(errno.EBADF, "descriptor not open", fd)
        _, obj_r, obj_w = items[fd]
        if obj_r is not None and events & _READABLE:
            r.append(obj_r)
        if obj_w is not None and events & _WRITABLE:
            w.append(obj_w)
    return r, w
