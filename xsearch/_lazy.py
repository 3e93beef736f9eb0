"""Lazy public names for packages whose imports are heavy (torch) or optional (onnxruntime)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable


def lazy_names(package: str, names: dict[str, str]) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package`` resolving ``names`` (name -> module) on first use."""

    def __getattr__(name: str):
        if name in names:
            value = getattr(importlib.import_module(names[name]), name)
            setattr(sys.modules[package], name, value)
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(names)

    return __getattr__, __dir__


def by_module(modules: dict[str, str]) -> dict[str, str]:
    """``{"pkg.mod": "name other"}`` -> ``{"name": "pkg.mod", "other": "pkg.mod"}``: a package's lazy names,
    listed by the module that defines them."""
    return {name: module for module, names in modules.items() for name in names.split()}
