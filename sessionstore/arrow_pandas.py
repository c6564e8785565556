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
  "absent". Until pandas is imported no pandas object can exist, so no conversion
  can tell the difference;
* an import hook waits for pandas' first import (by anyone: a
  ``transform_with_state_in_pandas`` task, a user's function, PySpark) and, the
  moment pandas is loaded, asks the shim for pandas by its raising path, which
  imports pyarrow's pandas layer and records "present", as a first check would.

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
import importlib.machinery
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
        bits = np.frombuffer(data, dtype=np.uint8)
        return np.unpackbits(bits, count=offset + n, bitorder="little")[offset:].view(bool)
    if n == 0:
        out = np.zeros(0, dtype=dtype)
    else:
        out = np.frombuffer(data, dtype=dtype, count=n, offset=offset * dtype.itemsize)
    out.flags.writeable = copied  # Arrow's buffers are immutable
    return out


def pandas_on_demand() -> bool:
    """Have pyarrow import pandas only once this process imports it (see the module
    doc); True if it took effect, False where pandas is imported already, pyarrow
    has no lazy shim or has checked for pandas already."""
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
    """Finds pandas as the path finder would, with a loader that tells pyarrow's
    shim once pandas is loaded; steps aside after its first use."""

    def __init__(self, shim: Any) -> None:
        self._shim = shim

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != _PANDAS:
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec  # not found here: the other finders take it
        spec.loader = _ThenTellArrow(spec.loader, self._shim)
        return spec


class _ThenTellArrow(importlib.abc.Loader):
    """``loader``, and after it ran pandas' module, pyarrow's raising check."""

    def __init__(self, loader: Any, shim: Any) -> None:
        self._loader, self._shim = loader, shim

    def create_module(self, spec: Any) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        # the module is whole and in sys.modules: pyarrow imports it (and its own
        # pandas layer) by the path a first check takes, and records "present"
        try:
            _ = self._shim.pd
        except ImportError:
            pass  # a pandas pyarrow does not support: as its own check would find

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)  # resources, get_data, is_package...
