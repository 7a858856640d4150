"""Run a function on a module right after it is imported (or now, if it already is).

The plugin registers things in verl modules that are expensive to import (the V1 trainers, the FSDP engine) and the
CPU mode patches some. Importing them from ``import verl`` in every Ray worker would cost seconds per process; this
hook waits until verl itself imports them, then acts before anyone can use them. Only the module names passed to
:func:`when_imported` are touched; every other import goes through Python's machinery untouched.
"""

from __future__ import annotations

import importlib.abc
import sys
import threading
from typing import Callable

_callbacks: dict[str, list[Callable]] = {}
_lock = threading.RLock()


class _Loader(importlib.abc.Loader):
    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        with _lock:
            callbacks = _callbacks.pop(module.__name__, [])
        for fn in callbacks:
            fn(module)

    def __getattr__(self, name):  # get_source, is_package, ... as the wrapped loader has them
        return getattr(self._loader, name)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname not in _callbacks:
            return None
        for finder in sys.meta_path:  # whoever would have found it (site-packages, an editable install, ...)
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _Loader(spec.loader)
        return spec


_finder = _Finder()


def when_imported(module_name: str, fn: Callable) -> None:
    """Call ``fn(module)`` once ``module_name`` has been executed; at once if it is already imported."""
    module = sys.modules.get(module_name)
    if module is not None:
        fn(module)
        return
    with _lock:
        _callbacks.setdefault(module_name, []).append(fn)
        if _finder not in sys.meta_path:
            sys.meta_path.insert(0, _finder)
