"""pyarrow without pandas until something imports pandas.

pyarrow looks for pandas at its first conversion from Python or numpy
(``pa.array``, ``pa.scalar``, ``Array.to_pylist``), to recognise pandas objects,
and so imports it: 0.47 CPU-s and about 40 MB in a process that never touches a
DataFrame. Our own processes are such processes: a state server whose operators
build their output with ``pa.array``, the CLI. :func:`pandas_on_demand` has
pyarrow take pandas as absent until pandas is imported, and from that import on
as present, exactly as if pyarrow had imported it itself:

* pyarrow records its check once (``pyarrow.lib._pandas_api``, its lazy pandas
  shim): the first check runs here, with ``import pandas`` failing, and records
  "absent". Until pandas is imported no pandas object can exist, so a conversion
  of Python or Arrow values gives what it gives where pandas is not installed:
  the same, but for nanosecond timestamps and durations, which become
  ``datetime`` and ``timedelta`` (or raise where that loses nanoseconds) instead
  of pandas' ``Timestamp`` and ``Timedelta`` (Spark's times are microseconds);
* an import hook waits for pandas' import (by anyone: a
  ``transform_with_state_in_pandas`` task, a user's function, PySpark), found by
  whichever finder would have found it, and, the moment pandas' module has run,
  asks the shim for pandas by its raising path, which imports pyarrow's pandas
  layer and records "present", as a first check would. The hook stays until
  then (a mere ``importlib.util.find_spec("pandas")`` leaves it waiting), and
  pandas' ``__loader__`` and ``__spec__.loader`` are its own loader again after.

Where the shim is not there (another pyarrow) or pandas is already imported,
nothing changes.

pyarrow's ``to_numpy`` runs its pandas conversion, which imports pandas itself
(not through the shim): :func:`numpy_of` gives what ``to_numpy(zero_copy_only=False)``
gives for the arrays the operators convert (booleans, integers and doubles without
nulls, whole or sliced, in chunks or not) from their buffers, and defers to
``to_numpy`` for any other array.
"""

from __future__ import annotations

import importlib.abc
import sys
from types import ModuleType
from typing import Any

import numpy as np
import pyarrow as pa

__all__ = ["pandas_on_demand", "numpy_of"]

_PANDAS = "pandas"

#: The fixed-width types :func:`numpy_of` reads from their data buffer.
_DTYPES = {
    pa.int8(): np.dtype(np.int8), pa.int16(): np.dtype(np.int16),
    pa.int32(): np.dtype(np.int32), pa.int64(): np.dtype(np.int64),
    pa.uint8(): np.dtype(np.uint8), pa.uint16(): np.dtype(np.uint16),
    pa.uint32(): np.dtype(np.uint32), pa.uint64(): np.dtype(np.uint64),
    pa.float32(): np.dtype(np.float32), pa.float64(): np.dtype(np.float64),
}  # fmt: skip


def numpy_of(values: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """``values.to_numpy(zero_copy_only=False)`` without pandas (see the module
    doc): a read-only view of an integer or double array's data, a new array of a
    boolean one's bits; arrays with nulls and other types go to ``to_numpy``."""
    copied = False  # a view of data only this call holds may be written, as to_numpy's
    if isinstance(values, pa.ChunkedArray):
        copied = values.num_chunks != 1
        values = values.chunk(0) if not copied else values.combine_chunks()
    dtype = _DTYPES.get(values.type)
    boolean = dtype is None and values.type == pa.bool_()
    if values.null_count or (dtype is None and not boolean):
        return values.to_numpy(zero_copy_only=False)
    n, offset = len(values), values.offset
    data = values.buffers()[1]
    if boolean:
        if n == 0:
            return np.zeros(0, dtype=bool)
        first, skip = divmod(offset, 8)  # unpack the slice's bytes only
        bits = np.frombuffer(data, dtype=np.uint8, offset=first)
        return np.unpackbits(bits, count=skip + n, bitorder="little")[skip:].view(bool)
    if n == 0:
        out = np.zeros(0, dtype=dtype)
    else:
        out = np.frombuffer(data, dtype=dtype, count=n, offset=offset * dtype.itemsize)
    out.flags.writeable = copied  # Arrow's buffers are immutable
    return out


def pandas_on_demand() -> bool:
    """Have pyarrow import pandas only once this process imports it (see the module
    doc); True if it took effect, False where pandas is imported already (by
    anyone, pyarrow's own check among them), pyarrow has no lazy shim, or the
    hook waits already."""
    if _PANDAS in sys.modules or any(isinstance(f, _PandasWatch) for f in sys.meta_path):
        return False
    import pyarrow.lib

    shim = getattr(pyarrow.lib, "_pandas_api", None)
    # on the type: reading either property on the shim would run its check
    if shim is None or not all(hasattr(type(shim), p) for p in ("have_pandas", "pd")):
        return False
    absent = _PandasAbsent()
    sys.meta_path.insert(0, absent)  # pandas' import fails while the check runs
    try:
        found = shim.have_pandas  # the one check that is recorded
    finally:
        sys.meta_path.remove(absent)
    if found:  # checked before this call, with pandas then importable
        return False
    sys.meta_path.insert(0, _PandasWatch(shim))
    return True


class _PandasAbsent(importlib.abc.MetaPathFinder):
    """Fails pandas' import (a ``None`` in ``sys.modules`` would not: Cython's
    import returns it)."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname == _PANDAS:
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
        return None


class _PandasWatch(importlib.abc.MetaPathFinder):
    """Finds pandas with the finders after it, and gives its spec a loader that
    tells pyarrow's shim once pandas' module has run; asked for any other module,
    or where no finder has pandas, it finds nothing."""

    def __init__(self, shim: Any) -> None:
        self._shim = shim

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != _PANDAS or self not in sys.meta_path:
            return None
        later = sys.meta_path[sys.meta_path.index(self) + 1 :]
        for finder in later:
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                break
        else:
            return None  # nowhere: the import fails as it would have
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec  # a namespace package or an old loader: left as found
        spec.loader = _ThenTellArrow(spec.loader, self._shim, self)
        return spec


class _ThenTellArrow(importlib.abc.Loader):
    """``loader``; after it ran pandas' module, the module and its spec get
    ``loader`` back, the hook goes and pyarrow's shim is asked by its raising path."""

    def __init__(self, loader: Any, shim: Any, watch: _PandasWatch) -> None:
        self._loader, self._shim, self._watch = loader, shim, watch

    def create_module(self, spec: Any) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        module.__loader__ = self._loader
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self._loader
        if self._watch in sys.meta_path:
            sys.meta_path.remove(self._watch)
        # the module is whole and in sys.modules: pyarrow imports it (and its own
        # pandas layer) by the path a first check takes, and records "present"
        try:
            _ = self._shim.pd
        except Exception:  # noqa: BLE001 - pandas is imported: its import must not fail
            pass  # a pandas pyarrow does not support: as its own check would find

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # copies and pickles look for these before __init__
            raise AttributeError(name)
        return getattr(self._loader, name)  # resources, get_data, is_package...
