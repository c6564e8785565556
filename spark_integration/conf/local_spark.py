"""A local SparkSession configured the way this project runs Spark (demo, tests,
benchmarks): Python workers on this interpreter, loopback networking, no UI."""

from __future__ import annotations

import os
import sys
from typing import Any

__all__ = ["local_spark", "UNIX_SOCKET_CONF"]

#: Spark 4.1+: Python workers talk to the JVM over a Unix socket instead of TCP.
UNIX_SOCKET_CONF = "spark.python.unix.domain.socket.enabled"
#: Set in the Python driver that ``spark-submit`` (or ``pyspark``) starts: the JVM
#: is running, with the submitted master and conf.
SUBMIT_ENV = "PYSPARK_GATEWAY_PORT"


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

    Run by ``spark-submit``, the session takes its master and settings from it (its
    ``--master``, ``--conf`` and ``spark.pyspark.python``): only keys it left unset
    get this function's defaults, and the driver's address is Spark's choice, which
    executors on other machines can reach.
    """
    submitted = SUBMIT_ENV in os.environ
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if not submitted:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    defaults = {
        "spark.sql.shuffle.partitions": str(partitions),
        "spark.ui.enabled": "false",
        # Python workers talk to the JVM over a Unix socket instead of loopback TCP:
        # over TCP each Python task stalls on its first Arrow message (a
        # small-write/delayed-ACK stall, measured in BENCHMARKS.md), a fixed cost per
        # task and micro-batch. Spark 4.1+ reads this; older releases ignore it. See
        # the README, "Spark operators" > "Configuration".
        UNIX_SOCKET_CONF: "true",
    }
    builder = SparkSession.builder.appName(app_name)
    if submitted:
        from pyspark import SparkConf

        given = {key for key, _ in SparkConf().getAll()}
        defaults = {k: v for k, v in defaults.items() if k not in given}
        if master:
            builder = builder.master(master)
    else:
        builder = builder.master(master or f"local[{cores},{max_failures}]")
        defaults["spark.driver.host"] = "127.0.0.1"
    for key, value in defaults.items():
        builder = builder.config(key, value)
    for key, value in conf.items():
        builder = builder.config(key.replace("__", "."), value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session
