"""A stand-in for a SparkSession where a test needs only what planning reads of it."""

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
    ``defaultParallelism`` = ``cores``, ``master`` and ``getConf().get`` over
    ``context_conf`` (the SparkContext's settings)."""
    conf = dict(conf or {})
    context = dict(context_conf or {})
    return SimpleNamespace(
        conf=SimpleNamespace(get=lambda key, default=None: conf.get(key, default)),
        sparkContext=SimpleNamespace(
            defaultParallelism=cores,
            master=master,
            getConf=lambda: SimpleNamespace(get=lambda k, d=None: context.get(k, d)),
        ),
    )
