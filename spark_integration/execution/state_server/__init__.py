"""State servers: a partition's state stays open in one process, whichever Python
worker Spark gives its task to.

Why. Spark runs a task in whichever Python worker of the executor is free, and
RocksDB admits one process per database. Held in the workers, a partition's
database is open in another worker about half the time when its next task
comes, and at many partitions per worker almost always, so the task reopens it
(50-200 ms each: at 200 partitions, 194 of 200 tasks per micro-batch; BENCHMARKS.md,
"State servers"). No setting of Spark pins a partition to a worker.

How. Each executor runs ``count`` state servers (:data:`SERVERS_CONF`; by default
:data:`SERVERS_PER_SLOT` per task slot) and partition ``p``'s tasks always run in
server ``p mod count``, where its database stays open from batch to batch:

* a task, in its Python worker, connects to its server and sends the operator
  task (cloudpickled, as Spark shipped it), what it knows of its Spark task
  (:class:`~spark_integration.execution.context.TaskInfo`) and its input as an Arrow IPC
  stream; the server runs the operator task exactly as the worker would have (the
  same provider, commit and coordinator report) and streams the output back, with
  the task's metrics record, or the exception it raised, which the worker raises;
* the first task that finds no server starts it (``python -m
  spark_integration.execution.state_server``, the worker's interpreter and import
  path, its own session), and with it the other missing servers of the slots its
  operator's partitions map to (no more: each is a process and its imports). A
  server listens on an abstract Unix socket named after its user, the executor's
  Python daemon (the worker's parent), ``count`` and its slot. Binding the name is
  the lock: the worker that binds it starts the server and hands it the listening
  socket, so the tasks of a first micro-batch that all find no server start one
  process per slot between them, and wait in its backlog while it imports its
  modules (a server that bound its own name would leave the other tasks to start
  one each and see it exit: up to 8 per slot on an 8-core executor, each a process
  and its imports);
* a server runs one task at a time. Two slots in a row of a micro-batch's tasks map
  to different servers, and with twice as many servers as slots the tasks that run
  at the same time rarely share one (a shared one makes the second task wait);
* it ends with its executor (it watches the daemon's pid) or after
  :data:`IDLE_EXIT_S` without tasks, once its databases are closed and its
  snapshot uploads done.

Trust, in both directions (docs/security.md): the socket name is predictable and an
abstract socket has no permissions, so anyone local could bind it first.

* A server serves only peers that run as our user (``SO_PEERCRED``): a request
  holds the cloudpickled task, which is code, the same trust PySpark's own daemon
  gives its JVM.
* A worker checks the server's credentials the same way right after it connects,
  before it sends anything: a server of another user gets no byte (the task's
  closure holds storage credentials and the coordinator's secret), the worker says
  so in one line and runs the task itself.
* Nothing a worker receives is unpickled (:mod:`.protocol`).

Failures: a server that dies mid-task ends the connection, the task
fails with an error that names the server, Spark retries it, and the retry starts
a new server, which loads the partition from its local database or the checkpoint
like any new process (the commit protocol is the one a worker follows, so nothing
committed is lost). A task that the server had not accepted yet (it was ending,
idle, or died while it started) connects again, starting a new server if the name
is free. Linux only (abstract sockets, ``pidfd``); elsewhere, or with
:data:`SERVERS_CONF` ``off``, tasks hold state in their own worker.

Modules: :mod:`.config` (the conf key, server count, time limits),
:mod:`.protocol` (request, frames, what a worker accepts), :mod:`.client` (the
worker's side: :class:`ServedTask`), :mod:`.server` (the server process).
"""

from spark_integration.execution.state_server.client import ForeignStateServer, ServedTask, served
from spark_integration.execution.state_server.config import (
    SERVERS_CONF,
    SERVERS_PER_SLOT,
    server_count,
)
from spark_integration.execution.state_server.protocol import REBUILT_ERRORS, StateServerLost
from spark_integration.execution.state_server.server import main

__all__ = [
    "SERVERS_CONF",
    "SERVERS_PER_SLOT",
    "StateServerLost",
    "ForeignStateServer",
    "REBUILT_ERRORS",
    "ServedTask",
    "served",
    "server_count",
    "main",
]
