"""pyarrow in a process that called ``pandas_on_demand``: no pandas until something
imports it, then pandas objects convert as they do in a process that never called
it. Each case runs in a fresh interpreter (the call changes a process for good)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

CONVERSIONS = """
import pandas as pd
out["after"] = {
    "have": pa.lib._pandas_api.have_pandas,
    "nullable": str(pa.array(pd.Series([1, None], dtype="Int64")).type),
    "nulls": pa.array(pd.Series([1, None], dtype="Int64")).null_count,
    "categorical": str(pa.array(pd.Categorical(["a", "b", "a"])).type),
    "tz": str(pa.array(pd.Series(pd.to_datetime(["2024-01-01"], utc=True))).type),
    "frame": pa.RecordBatch.from_pandas(pd.DataFrame({"a": [1, 2]})).to_pylist(),
    "back": pa.table({"a": [1, 2]}).to_pandas()["a"].tolist(),
}
"""


@pytest.fixture(scope="module")
def plain():
    """:data:`CONVERSIONS` in an interpreter that never called ``pandas_on_demand``."""
    return _run("import pyarrow as pa\n", CONVERSIONS)


def _run(*parts: str) -> dict:
    """The JSON of ``out`` after the code ``parts`` ran in a new interpreter."""
    body = "".join(textwrap.dedent(part) for part in parts)
    code = "import json, sys\nout = {}\n" + body + "\nprint(json.dumps(out))"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])  # after what the code printed


def test_pyarrow_converts_without_pandas_until_pandas_is_imported_then_as_with_it(plain):
    on_demand = _run(
        """
        import numpy as np
        import pyarrow as pa
        from sessionstore.arrow_pandas import pandas_on_demand

        out["took"] = pandas_on_demand()
        out["again"] = pandas_on_demand()
        # what operators and their outputs do: typed arrays from lists and numpy
        pa.array([1, 2], pa.int64())
        pa.array(np.arange(3))
        pa.array([1, None], pa.int64()).to_pylist()
        pa.scalar(1, pa.int64())
        out["pandas_before"] = "pandas" in sys.modules
        """,
        CONVERSIONS,
    )
    assert on_demand["took"] is True and on_demand["again"] is False
    assert on_demand["pandas_before"] is False
    assert on_demand["after"] == plain["after"]
    assert plain["after"]["have"] is True
    assert plain["after"]["categorical"].startswith("dictionary<values=string")
    assert plain["after"]["nulls"] == 1


def test_nothing_changes_where_pandas_is_imported_already():
    out = _run(
        """
        import pandas
        import pyarrow as pa
        from sessionstore.arrow_pandas import pandas_on_demand

        out["took"] = pandas_on_demand()
        out["finders"] = [type(f).__name__ for f in sys.meta_path]
        out["have"] = pa.lib._pandas_api.have_pandas
        """
    )
    assert out["took"] is False
    assert "_PandasWatch" not in out["finders"] and out["have"] is True


def test_a_pyarrow_that_checked_for_pandas_already_is_left_as_it_is():
    """pyarrow checked (and imported pandas) before the call: the call does nothing."""
    out = _run(
        """
        import pyarrow as pa
        pa.array([1])  # an inferred type: pyarrow's check imports pandas
        del sys.modules["pandas"]  # gone from the modules, still known to pyarrow
        from sessionstore.arrow_pandas import pandas_on_demand

        out["took"] = pandas_on_demand()
        out["finders"] = [type(f).__name__ for f in sys.meta_path]
        """
    )
    assert out["took"] is False and "_PandasWatch" not in out["finders"]


def test_numpy_of_gives_what_to_numpy_gives_without_importing_pandas():
    """Every fixed-width type and booleans, whole, sliced at every offset, empty, in
    one chunk or several, with nulls (to_numpy's own path): the same values, dtype
    and writeability as ``to_numpy(zero_copy_only=False)``; pandas stays out while
    nothing but null-free arrays are converted."""
    out = _run(
        """
        import numpy as np
        import pyarrow as pa
        from sessionstore.arrow_pandas import numpy_of, pandas_on_demand

        pandas_on_demand()
        rng = np.random.default_rng(3)
        types = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                 "uint64", "float32", "float64"]
        arrays = [pa.array(rng.integers(0, 100, 37).astype(t)) for t in types]
        arrays.append(pa.array(rng.random(37) < 0.5))
        cases = []
        for whole in arrays:
            for start in range(0, 12):
                for length in (0, 1, 7, 8, 9, 25 - start):
                    cases.append(whole.slice(start, length))
            cases.append(pa.chunked_array([whole.slice(3, 5)]))
            cases.append(pa.chunked_array([whole.slice(0, 9), whole.slice(11)]))
            cases.append(pa.chunked_array([], whole.type))
        seen = []
        for case in cases:
            got = numpy_of(case)
            seen.append((got.tolist(), str(got.dtype), got.flags.writeable))
        out["pandas_after_null_free"] = "pandas" in sys.modules
        with_nulls = pa.array([1, None, 3], pa.int64())
        seen.append(numpy_of(with_nulls).tolist())
        out["numpy_of"] = seen
        """,
        """
        want = []
        for case in cases:
            if isinstance(case, pa.ChunkedArray):
                got = case.to_numpy()
            else:
                got = case.to_numpy(zero_copy_only=False)
            want.append((got.tolist(), str(got.dtype), got.flags.writeable))
        want.append(with_nulls.to_numpy(zero_copy_only=False).tolist())
        out["to_numpy"] = want
        out["cases"] = len(cases)
        """,
    )
    assert out["pandas_after_null_free"] is False
    assert out["cases"] > 700
    assert out["numpy_of"] == out["to_numpy"]  # json's NaN is one object: nulls compare


def test_a_probe_for_pandas_or_another_finder_leaves_pyarrow_told_at_the_import(plain):
    """A ``find_spec`` probe before the import (PySpark's ``have_package`` does one)
    leaves the hook waiting; pandas found by a finder after the path finder still
    tells pyarrow; pandas' module keeps its own loader."""
    probe = _run(
        """
        import importlib.machinery, importlib.util, pickle
        import pyarrow as pa
        from sessionstore.arrow_pandas import pandas_on_demand

        pandas_on_demand()
        out["probed"] = importlib.util.find_spec("pandas") is not None
        """,
        CONVERSIONS,
        """
        out["loader"] = isinstance(pd.__loader__, importlib.machinery.SourceFileLoader)
        out["spec_loader"] = pd.__spec__.loader is pd.__loader__
        out["spec_pickles"] = len(pickle.dumps(pd.__spec__)) > 0
        """,
    )
    elsewhere = _run(
        """
        import importlib.machinery
        import pyarrow as pa
        from sessionstore.arrow_pandas import pandas_on_demand

        class Elsewhere:  # a finder before the path finder (a zipapp's, a pex's)
            asked = 0

            def find_spec(self, name, path=None, target=None):
                if name == "pandas":
                    Elsewhere.asked += 1
                    return importlib.machinery.PathFinder.find_spec(name, path)

        pandas_on_demand()
        path_finder = sys.meta_path.index(importlib.machinery.PathFinder)
        sys.meta_path.insert(path_finder, Elsewhere())
        """,
        CONVERSIONS,
        """
        out["asked"] = Elsewhere.asked
        """,
    )
    assert probe["probed"] is True
    assert probe["after"] == plain["after"] == elsewhere["after"]
    assert probe["loader"] and probe["spec_loader"] and probe["spec_pickles"]
    assert elsewhere["asked"] == 1


def test_the_cli_writes_parquet_without_importing_pandas(tmp_path):
    """``sessionstore dump --format parquet`` converts its rows with pyarrow in a
    process that never imports pandas; the file holds the store's rows."""
    db = tmp_path / "db"
    parquet = tmp_path / "out.parquet"
    out = _run(
        f"""
        from sessionstore import StateDB
        with StateDB.open({str(db)!r}) as db:
            db.session_store("s", 10**6).put_many((f"u{{i}}", i, i + 5, i) for i in range(3))
        from sessionstore.tools.cli import main
        try:
            main(["dump", {str(db)!r}, "--store", "s", "--format", "parquet",
                  "--output", {str(parquet)!r}])
        except SystemExit as exc:
            out["exit"] = exc.code
        out["pandas"] = "pandas" in sys.modules
        import pyarrow.parquet as pq
        out["rows"] = pq.read_table({str(parquet)!r}).select(["key", "start"]).to_pylist()
        """
    )
    assert out.get("exit") in (None, 0)
    assert out["pandas"] is False
    assert out["rows"] == [{"key": f"u{i}", "start": i} for i in range(3)]
