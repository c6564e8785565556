"""Package namespaces that import what they name on first use (PEP 562).

``import sessionstore`` or ``from spark_integration import sessionize`` used to
import every module of the package at once (pyarrow, numpy, rocksdict, pyspark's
SQL layer, every operator), about 2.5 s. Every process that needs one small
module of a package paid it: each Python process Spark starts for the due source,
a Python data source (its planning, its streaming runner), a state server, the
CLI. So a package's ``__init__`` names its public API with where each name
lives, and a name is imported when first used; ``__all__``, ``dir()`` and
``from package import *`` still list all of it.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, exports: dict[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module ``__getattr__`` and ``__dir__`` of ``package`` whose public names
    are ``exports`` (name -> the module that defines it). A name is imported on
    first use and then kept in the package's namespace; any other name that is a
    module of the package is that module, imported."""

    def __getattr__(name: str) -> Any:
        where = exports.get(name)
        if where is None:
            # a subpackage or module (``sessionstore.checkpoint``): the eager
            # ``__init__`` imported them, and code written then reaches them so
            if not name.startswith("_") and importlib.util.find_spec(f"{package}.{name}"):
                return importlib.import_module(f"{package}.{name}")
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(where), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *exports})

    return __getattr__, __dir__
