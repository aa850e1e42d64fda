"""Modules a sandbox worker keeps compiled instead of loaded, and a lean worker's last finder (worker.py imports this
as a top-level module beside itself, before its chroot; standard library only).

Every page of the worker is mapped again in each run's fork, and the fork's page-table copy and the run's exit cost
in proportion to them. The standard library's codecs (``encodings.*``, which ``str.encode`` and ``bytes.decode``
import by name) are 3 MB of objects in a worker, about a third of it, and few programs use one. They are kept as
their compiled files instead (0.6 MB, in bytes no run touches unless it imports the module), and the run that
imports one goes through the interpreter's own ``SourceFileLoader`` code (``get_code``, the compiled file's checks,
``exec_module``), of which only the two calls that would touch the file system answer from memory: the same frames
as a script's import (so the same depth at which it meets the recursion limit, and the same traceback), the same
module attributes as a loaded module after ambient.py cut its paths (``__file__`` a base name, a loader of that
name), the same result or the same error. What every such module imports itself the worker loads (the trainer lists
it: lorapop/executor/handle.py), so that an import works in the sandbox exactly where it works in a script. What a
program can tell: one more finder at the end of ``sys.meta_path``, and the loader's class is a subclass
(docs/METHOD.md, "Facts of the machine").
"""

import _imp
import os
import sys

ESCALATE_EXIT = 93  # the exit code of a lean worker's run that imported what its worker lacks (handle.py reads it)
_bootstrap = sys.modules["_frozen_importlib"]
_external = sys.modules["_frozen_importlib_external"]


class SourceFileLoader(_external.SourceFileLoader):
    """The interpreter's loader for a module kept compiled: its compiled file (a timestamp ``.pyc``, header and code)
    and the stat of its source come from ``store`` (name -> (compiled file, file base name, cached file base name,
    the source's stat)), everything else is the interpreter's own code. Named, and placed, as the class it stands
    for. The source itself is not kept (it would cost the worker as much again): a program that turns compiled files
    off (``sys.implementation.cache_tag = None``) gets FileNotFoundError where a script reads and compiles the source."""

    store = {}

    def path_stats(self, path):
        return dict(self.store[self.name][3])

    def get_data(self, path):
        try:  # the one compiled file a script's loader would find for it (with the interpreter's current cache tag)
            if path == _external.cache_from_source(self.path):
                return self.store[self.name][0]
        except NotImplementedError:  # no cache tag: compiled files turned off
            pass
        raise FileNotFoundError(2, "No such file or directory", path)  # the source: gone with the chroot


SourceFileLoader.__module__ = "_frozen_importlib_external"


class StoredModules:
    """The meta path finder for the modules kept compiled. Last on ``sys.meta_path``: a module the path finders can
    still find (a worker without a chroot) is imported from its file as usual."""

    def find_spec(self, name, path=None, target=None):
        entry = SourceFileLoader.store.get(name)
        if entry is None:
            return None
        spec = _bootstrap.ModuleSpec(name, SourceFileLoader(name, entry[1]), origin=entry[1])
        spec.has_location, spec.cached = True, entry[2]
        return spec


def preimport(names):
    """Import ``names``; returns those this install has (the rest stay out of the hello's list)."""
    loaded = []
    for name in names:
        try:
            loaded.append(__import__(name) and name)
        except Exception:  # not on this install
            continue
    return loaded


def install(names):
    """Compile the plain (non-package) modules ``names`` from their files (before the chroot) and put a finder for
    them last on ``sys.meta_path``. Returns the names stored; a name not found, a package, one already loaded or one
    whose file does not compile is left out (and so not importable in the sandbox)."""
    store = SourceFileLoader.store
    for name in names:
        parent = name.rpartition(".")[0]
        if name in sys.modules or (parent and parent not in sys.modules):
            continue
        try:
            path = getattr(sys.modules[parent], "__path__", None) if parent else None
            spec = _external.PathFinder.find_spec(name, path)
            if spec is None or spec.submodule_search_locations is not None or not spec.has_location:
                continue
            code = spec.loader.get_code(name)
            stats = spec.loader.path_stats(spec.origin)
        except (ImportError, OSError, SyntaxError, ValueError, AttributeError):
            continue
        origin = os.path.basename(spec.origin)
        _imp._fix_co_filename(code, origin)  # nested code too: the path it was compiled at, cut as ambient.py does
        # a timestamp pyc of the source's stat, as the interpreter writes one: what a script's import validates
        pyc = _external._code_to_timestamp_pyc(code, stats["mtime"], stats.get("size", 0))
        store[name] = (bytes(pyc), origin, spec.cached and os.path.basename(spec.cached), stats)
    if store:
        sys.meta_path.append(StoredModules())
    return sorted(store)


class Escalate:
    """The last finder of a lean worker (config ``lean_preload``): in a run's child, a module that nothing before it
    on ``sys.meta_path`` has (nothing loads from a file after the chroot) ends the run at once, with nothing written,
    under an exit code the trainer reads as "run it again from its start on a full worker" (sandbox.py), where the
    import goes as it would have. Before any module it lacks, a lean worker's run is the full worker's run; the
    worker itself never imports after its setup (and would find the module missing, as a full one would)."""

    armed = False  # set in the run's child alone, once its setup is done (the filter refuses getpid to both)

    def find_spec(self, name, path=None, target=None):
        if self.armed:
            os._exit(ESCALATE_EXIT)
        return None
