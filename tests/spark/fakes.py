"""Stand-ins for what Spark gives: a SparkSession where a test needs only what
planning reads of it, and a Spark task's call of an operator task."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any


def fake_session(
    conf: dict[str, Any] | None = None,
    cores: int = 2,
    master: str = "local[2]",
    context_conf: dict[str, Any] | None = None,
) -> Any:
    """``spark.conf.get`` over ``conf``; ``spark.sparkContext`` with
    ``defaultParallelism`` = ``cores``, ``master`` and ``getConf().get``/``getAll`` over
    ``context_conf`` (the SparkContext's settings)."""
    conf = dict(conf or {})
    context = dict(context_conf or {})
    return SimpleNamespace(
        conf=SimpleNamespace(get=lambda key, default=None: conf.get(key, default)),
        sparkContext=FakeContext(
            defaultParallelism=cores,
            master=master,
            getConf=lambda: SimpleNamespace(
                get=lambda k, d=None: context.get(k, d), getAll=lambda: list(context.items())
            ),
        ),
    )


class FakeContext(SimpleNamespace):
    """A SparkContext stand-in: a SparkContext can be weakly referred to (the
    driver keeps its conf by context, spark_integration.conf.spark_session)."""

    __slots__ = ("__weakref__",)
    __eq__ = object.__eq__  # one context is one key, as a SparkContext is
    __hash__ = object.__hash__


def run_task(monkeypatch: Any, module: Any, task: Any, info: Any, columns: dict[str, Any],
             schema: Any) -> list[tuple]:  # fmt: skip
    """Run ``task`` (an operator task of ``module``) as the Spark task ``info`` over
    one batch of ``columns`` (name -> values, Arrow ``schema``); its output rows as
    sorted tuples."""
    import pyarrow as pa

    from spark_integration.execution.context import TaskContext

    batch = pa.RecordBatch.from_pydict(columns, schema=schema)
    out = list(task.run(iter([batch]), TaskContext(info)))
    return sorted(r for b in out for r in zip(*b.to_pydict().values(), strict=True))
