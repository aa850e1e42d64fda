"""Programs compiled for their runs, in a helper process: the trainer's side of it (:class:`Compiler`) and the helper's
own code (:data:`HELPER`).

A run that compiles its own program leaves the compiler's objects on pages it shares with its worker, each of them
then copied (about 70 page copies a run, measured); code compiled once, elsewhere, and loaded from marshal's bytes
costs the run far less, and a task's program runs at least twice (the two hash seeds) and again in every check.

Not in the trainer. The compile of a hostile text can cost far more than the text: CPython folds operators on
constants keeping every intermediate (a chain of ``'\\U0010ffff'*4096`` terms, 5,623 characters: 4.4 GB and 3.6 s in
one compile), writes a ``finally`` body once per way out of its ``try`` (nesting triples it per level: 3.7 GB from
626 characters) and reorders a match OR-pattern's names with swaps that grow with the cube of their number; a check
of the tree's shape closes one such stage at a time. So the helper compiles, started as a worker is (the same
interpreter, ``-s -S``, a scrubbed environment, nothing imported but what compiling needs), with the runs' own
address-space limit; the trainer waits for each answer at most 0.2 s (an honest program compiles in milliseconds),
past which the helper is killed and started again, and a run whose compile finds the helper busy compiles its own
(a slow text holds up no other run). Whatever the helper does not compile (an error, the limits, a set constant, a
text over ``MAX_CHARS``, a compiled form far longer than its text, an interpreter other than the workers') the run
compiles itself, as it always could, under its own limits. The helper compiles exactly as a run does
(``compile(text, "<program>", "exec")`` in an interpreter whose :func:`worker.compiler_id` the workers share; its
depth limit no looser than a script's), so a program gives the same result either way (tests/test_executor.py).
"""

from __future__ import annotations

import os
import struct
import subprocess
import threading
import time
from collections import OrderedDict
from pathlib import Path

from .base import ready
from .worker import write_all  # every byte, in as many writes as it takes

_LEN = struct.Struct(">I")
MAX_CHARS = 16384  # longer programs are compiled by their run
# A compiled form longer than 16 bytes a byte of its text (at least 64 KiB) is not sent back, nor kept: its run
# compiles it. Folded constants can make it far longer than its text (2.3 KB gave 4 MB), and it goes to every run.
CODE_BYTES_PER_TEXT_BYTE, MIN_CODE_BYTES = 16, 1 << 16
MAX_CODE_BYTES = CODE_BYTES_PER_TEXT_BYTE * 4 * MAX_CHARS
CACHE_BYTES = 16 << 20  # texts and answers kept, at most
WAIT_S = 0.02  # a caller that finds the helper busy this long compiles in its run: no text holds up another's run

# The helper: argv = [address-space limit in bytes (0: none), the directory of worker.py]. It answers its compiler id,
# then for each text (length-prefixed UTF-8) marshal's bytes of its code, or nothing (length 0) where it did not
# compile it; after a compile that ran out of memory it exits (its heap stays grown otherwise: 250 MB), and the
# trainer starts another. A set constant is not sent: built in this process's iteration order, a set of strings could
# iterate in another order than the run's own compile gives. Its compile runs two frames deeper than a script's
# (which runs before any frame): a program nested to within those of the limit fails here, and its run compiles it
# as a script.
HELPER = r"""
import marshal, sys
sys.path.insert(0, sys.argv[2])
import resource, worker
limit = int(sys.argv[1])
if limit:
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

def has_set(code):
    stack = list(code.co_consts)
    while stack:
        c = stack.pop()
        if type(c) is frozenset:
            return True
        if type(c) is tuple:
            stack.extend(c)
        elif type(c) is type(code):
            stack.extend(c.co_consts)
    return False

def serve(inp, out, size):
    while True:
        head = inp.read(4)
        if len(head) < 4:
            return
        raw = inp.read(size.unpack(head)[0])
        spent = False
        try:
            code = compile(raw.decode("utf-8", "surrogatepass"), "<program>", "exec")
            data = b"" if has_set(code) else marshal.dumps(code)
        except MemoryError:  # the runs' limit
            data, spent = b"", True
        except BaseException:  # RecursionError, SyntaxError, ...: the run's to meet
            data = b""
        code = None
        data = data if len(data) <= max(%d, %d * len(raw)) else b""
        out.write(size.pack(len(data)) + data)
        out.flush()
        if spent:
            return

size, ident = __import__("struct").Struct(">I"), worker.compiler_id().encode()
out = sys.stdout.buffer
out.write(size.pack(len(ident)) + ident)
out.flush()
serve(sys.stdin.buffer, out, size)
""" % (MIN_CODE_BYTES, CODE_BYTES_PER_TEXT_BYTE)


class Compiler:
    """The trainer's side of one helper: :meth:`compile` is thread-safe (the helper takes one text at a time; a caller
    that finds it busy for WAIT_S gets None), keeps the last ``cache`` answers by text (at most CACHE_BYTES), starts
    the helper on first use and again after it was killed or ended. ``timeout_s``: the longest wait for one answer,
    after which the helper is killed (an honest program compiles in milliseconds)."""

    def __init__(self, python: str, memory_bytes: int, timeout_s: float, cache: int = 256):
        self.python, self.memory_bytes, self.timeout_s, self.cache_size = python, memory_bytes, timeout_s, cache
        self.ident: str | None = None  # the helper's compiler id, once started
        self._proc: subprocess.Popen | None = None
        self._ended: list[subprocess.Popen] = []  # killed, not yet reaped
        self._helper = threading.Lock()  # held while the helper compiles one text
        self._lock = threading.Lock()  # the cache's
        self._cache: OrderedDict[str, bytes | None] = OrderedDict()
        self._cache_bytes = 0
        self._closed = False

    def compile(self, code: str) -> bytes | None:
        """Marshal's bytes of ``code`` compiled as its run would compile it, or None: its run compiles it."""
        if len(code) > MAX_CHARS:
            return None
        with self._lock:
            if code in self._cache:
                self._cache.move_to_end(code)
                return self._cache[code]
        if not self._helper.acquire(timeout=WAIT_S):
            return None  # busy (a slow text, maybe): this run compiles its own, and nothing is kept
        try:
            data, decided = self._ask(code.encode("utf-8", "surrogatepass"))
        finally:
            self._helper.release()
        with self._lock:
            if decided and code not in self._cache:  # not a helper found gone twice: the next ask may do better
                self._cache[code] = data
                self._cache_bytes += 4 * len(code) + len(data or b"")  # a str takes up to 4 bytes a character
            while self._cache and (len(self._cache) > self.cache_size or self._cache_bytes > CACHE_BYTES):
                old, kept = self._cache.popitem(last=False)
                self._cache_bytes -= 4 * len(old) + len(kept or b"")
        return data

    def clear(self) -> None:
        """Forget every answer kept (a benchmark's pass meets its programs new, as training does)."""
        with self._lock:
            self._cache.clear()
            self._cache_bytes = 0

    def _ask(self, text: bytes) -> tuple[bytes | None, bool]:
        """(the answer, or None; whether it is the helper's decision: an answer, or its clock run out). Every exchange
        not read whole ends the helper, whatever ended it (a missed clock, a helper gone, an exception in this thread:
        KeyboardInterrupt, a cancelled task): an answer left in the pipe would be read as the next text's. A helper
        found gone (it exits after a compile that ran out of memory) is started again, once."""
        for _ in range(2):
            if self._proc is None or self._proc.poll() is not None:
                if self._closed or not self._start():
                    return None, False
            whole = False
            try:
                write_all(self._proc.stdin.fileno(), _LEN.pack(len(text)) + text)  # over a pipe's capacity too
                data = self._read(time.monotonic() + self.timeout_s)
                whole = data is not None
                if whole:
                    return data or None, True
                return None, True  # past its clock: this text is the run's
            except (OSError, EOFError):
                continue  # gone before it answered: a fresh helper, once
            finally:
                if not whole:
                    self._stop()
        return None, False

    def _read(self, deadline: float) -> bytes | None:
        """One length-prefixed answer from the helper, or None when the deadline passed first; EOFError when the
        helper ended."""
        head = self._exactly(_LEN.size, deadline)
        if head is None:
            return None
        if _LEN.unpack(head)[0] > MAX_CODE_BYTES:
            raise EOFError("an answer over the bound")
        return self._exactly(_LEN.unpack(head)[0], deadline)

    def _exactly(self, n: int, deadline: float) -> bytes | None:
        fd, chunks, got = self._proc.stdout.fileno(), [], 0
        while got < n:
            left = deadline - time.monotonic()
            if left <= 0 or not ready([fd], [], left)[0]:
                return None
            chunk = os.read(fd, n - got)
            if not chunk:
                raise EOFError("the helper ended")
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)

    def _start(self) -> bool:
        try:
            self._proc = subprocess.Popen(
                [self.python, "-s", "-S", "-c", HELPER, str(int(self.memory_bytes)), str(Path(__file__).parent)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd="/",
                env={"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8"}, start_new_session=True, close_fds=True)
        except OSError:
            self._proc = None
            return False
        ident = None
        try:
            ident = self._read(time.monotonic() + max(self.timeout_s, 30.0))
        except (OSError, EOFError):
            pass
        finally:
            if ident is None:  # its id unread (whatever ended the wait): never asked a text
                self._stop()
        if ident is None:
            return False
        self.ident = ident.decode("utf-8", "replace")
        return True

    def _stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            self._ended.append(proc)  # reaped here, or by a later stop if this wait is interrupted
        for proc in list(self._ended):
            try:
                proc.kill()
            except OSError:
                pass
            proc.wait()
            self._ended.remove(proc)
            for f in (proc.stdin, proc.stdout):
                try:
                    f.close()
                except OSError:
                    pass

    def close(self) -> None:
        # a compile ends within its clock; a close that waited longer stops the helper under it (its answer is then
        # "gone", never another text's), so no compile can hold the process's exit
        got = self._helper.acquire(timeout=max(1.0, 5 * self.timeout_s))
        try:
            self._closed = True
            self._stop()
        finally:
            if got:
                self._helper.release()
