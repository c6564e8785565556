"""A local SparkSession configured the way this project runs Spark (demo, tests,
benchmarks): Python workers on this interpreter, loopback networking, no UI."""

from __future__ import annotations

import os
import sys
from typing import Any

__all__ = ["local_spark", "UNIX_SOCKET_CONF"]

#: Spark 4.1+: Python workers talk to the JVM over a Unix socket instead of TCP.
UNIX_SOCKET_CONF = "spark.python.unix.domain.socket.enabled"


def local_spark(
    app_name: str,
    partitions: int = 2,
    cores: int = 2,
    max_failures: int = 1,
    master: str | None = None,
    **conf: str,
) -> Any:
    """``local[cores]`` SparkSession with ``partitions`` shuffle partitions; with
    ``max_failures > 1`` a failed task is retried (local mode's default is never).
    ``master`` replaces the local master (for example ``spark://host:7077``); keyword
    ``conf`` keys use ``__`` for dots.

    Python workers must run this interpreter, or they miss the installed packages;
    ``SPARK_LOCAL_IP`` keeps Spark on the loopback interface.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(master or f"local[{cores},{max_failures}]")
        .appName(app_name)
        .config("spark.sql.shuffle.partitions", str(partitions))
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
    )
    # Python workers talk to the JVM over a Unix socket instead of loopback TCP:
    # over TCP each Python task stalls on its first Arrow message (a
    # small-write/delayed-ACK stall, measured in BENCHMARKS.md), a fixed cost per
    # task and micro-batch. Spark 4.1+ reads this; older releases ignore it. See
    # the README, "Spark operators" > "Configuration".
    conf.setdefault(UNIX_SOCKET_CONF.replace(".", "__"), "true")
    for key, value in conf.items():
        builder = builder.config(key.replace("__", "."), value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session
