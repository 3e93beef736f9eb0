"""The ``xsearch`` command line: one module per command group; nothing else in xsearch imports it."""

from __future__ import annotations

from xsearch.cli.main import main

__all__ = ["main"]
