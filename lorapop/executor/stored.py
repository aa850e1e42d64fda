"""Modules a sandbox worker keeps compiled instead of loaded (worker.py imports this as a top-level module beside
itself, before its chroot; standard library only).

Every page of the worker is mapped again in each run's fork, and the fork's page-table copy and the run's exit cost
in proportion to them. The standard library's codecs (``encodings.*``, which ``str.encode`` and ``bytes.decode``
import by name) are 3 MB of objects in a worker, about a third of it, and few programs use one. They are kept as
their marshalled code instead (0.6 MB, in bytes no run touches unless it imports the module), and the run that
imports one executes it then, as a plain interpreter executes the ``.pyc`` it finds: the same code, the same module
attributes as a loaded module after ambient.py cut its paths (``__file__`` a base name, a ``SourceFileLoader`` of
that name), the same result or the same error. What every such module imports itself the worker loads (the trainer
lists it: lorapop/executor/handle.py), so that an import works in the sandbox exactly where it works in a script.
What a program can tell: one more finder at the end of ``sys.meta_path`` (docs/METHOD.md, "Facts of the machine").
"""

import _imp
import marshal
import os
import sys

_bootstrap = sys.modules["_frozen_importlib"]
_external = sys.modules["_frozen_importlib_external"]


class StoredModules:
    """A meta path finder and loader for the modules in ``store``: name -> (marshalled code, file base name, cached
    file base name or None). Last on ``sys.meta_path``: a module the path finders can still find (a worker without a
    chroot) is imported from its file as usual."""

    def __init__(self, store):
        self.store = store

    def find_spec(self, name, path=None, target=None):
        entry = self.store.get(name)
        if entry is None:
            return None
        spec = _bootstrap.ModuleSpec(name, self, origin=entry[1])
        spec.has_location, spec.cached = True, entry[2]
        return spec

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        name = module.__spec__.name
        code, origin, _ = self.store[name]
        # the loader a loaded module shows once its path is cut (ambient.hide_namespace), set before its code runs
        module.__loader__ = module.__spec__.loader = _external.SourceFileLoader(name, origin)
        exec(marshal.loads(code), module.__dict__)


def install(names):
    """Compile the plain (non-package) modules ``names`` from their files (before the chroot) and put a finder for
    them last on ``sys.meta_path``. Returns the names stored; a name not found, a package, one already loaded or one
    whose file does not compile is left out (and so not importable in the sandbox)."""
    store = {}
    for name in names:
        parent, _, base = name.rpartition(".")
        if name in sys.modules or (parent and parent not in sys.modules):
            continue
        try:
            path = getattr(sys.modules[parent], "__path__", None) if parent else None
            spec = _external.PathFinder.find_spec(name, path)
            if spec is None or spec.submodule_search_locations is not None or not spec.has_location:
                continue
            code = spec.loader.get_code(name)
        except (ImportError, OSError, SyntaxError, ValueError):
            continue
        origin = os.path.basename(spec.origin)
        _imp._fix_co_filename(code, origin)  # nested code too: the path it was compiled at, cut as ambient.py does
        store[name] = (marshal.dumps(code), origin, spec.cached and os.path.basename(spec.cached))
    if store:
        sys.meta_path.append(StoredModules(store))
    return sorted(store)

