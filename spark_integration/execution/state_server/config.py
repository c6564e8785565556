"""State server settings: the Spark conf key, how many servers an executor runs,
and the time limits of a server's life and of its exchanges."""

from __future__ import annotations

import os
import re
from typing import Any

from sessionstore.engine.memory import DEFAULT_MEMORY_MAX_MB
from spark_integration.conf.backend import CONF_PREFIX
from spark_integration.conf.spark_session import driver_conf, is_connect
from spark_integration.conf.spark_session import master as session_master

__all__ = [
    "SERVERS_CONF",
    "SERVERS_PER_SLOT",
    "DEFAULT_SERVER_MEMORY_MB",
    "IDLE_EXIT_S",
    "START_TIMEOUT_S",
    "IO_TIMEOUT_S",
    "REQUEST_TIMEOUT_S",
    "server_count",
    "servers_here",
    "executor_slots",
]

#: Spark conf key: state servers per executor: ``auto`` (default,
#: :data:`SERVERS_PER_SLOT` per task slot), ``off`` (tasks hold state in their own
#: Python worker) or a number.
SERVERS_CONF = CONF_PREFIX + "stateServers"
#: Servers per task slot by default (see the package doc: fewer waits for a server).
SERVERS_PER_SLOT = 2
#: A server's RocksDB memory budget when ``memory.maxMB`` is not set, in MiB.
DEFAULT_SERVER_MEMORY_MB = DEFAULT_MEMORY_MAX_MB // SERVERS_PER_SLOT
#: A server with no task for this long closes its databases and exits.
IDLE_EXIT_S = 600.0
#: How long a task waits for a server it started to listen.
START_TIMEOUT_S = 60.0
#: A peer silent this long mid-exchange is gone (an input that arrives slowly from
#: the shuffle is not silence: each batch resets it).
IO_TIMEOUT_S = 600.0
#: How long a connected worker may take to send its request (it sends it at once).
REQUEST_TIMEOUT_S = 10.0


def server_count(spark: Any) -> int | None:
    """State servers per executor for operators built now: 0 (off), a number, or
    None when each executor decides (:data:`SERVERS_PER_SLOT` per core it has)."""
    value = spark.conf.get(SERVERS_CONF, "auto")
    text = str(value).strip().lower()
    if text in ("auto", ""):
        slots = executor_slots(spark)
        return None if slots is None else SERVERS_PER_SLOT * slots
    if text in ("off", "false", "no"):
        return 0
    count = int(text) if text.isdigit() else -1
    if count < 0:
        raise ValueError(
            f"{SERVERS_CONF} must be 'auto', 'off' or a number of servers per executor, "
            f"got {value!r}"
        )
    return count


def servers_here(count: int | None) -> int:
    """The state servers of this executor for an operator planned with ``count``
    (:func:`server_count`; None: :data:`SERVERS_PER_SLOT` per core of this machine)."""
    return count or SERVERS_PER_SLOT * (os.cpu_count() or 1)


def executor_slots(spark: Any) -> int | None:
    """Task slots per executor: from a local master, else ``spark.executor.cores``
    over ``spark.task.cpus``; None if the driver cannot tell (also ``local[*]``
    under Spark Connect: this process is the client, whose cores are not the
    server's, so each executor counts its own)."""
    conf, master = driver_conf(spark), session_master(spark).replace(" ", "")
    local = re.fullmatch(r"local(?:\[(\*|\d+)(?:,\d+)?\])?", master)
    if local:
        given = local.group(1)
        if given == "*":
            return None if is_connect(spark) else os.cpu_count() or 1
        return 1 if given is None else int(given)
    cluster = re.fullmatch(r"local-cluster\[\d+,(\d+),\d+\]", master)
    cores = cluster.group(1) if cluster else conf.get("spark.executor.cores", None)
    if cores is None:
        return None
    return max(1, int(cores) // max(1, int(conf.get("spark.task.cpus", "1"))))
