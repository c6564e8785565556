"""``transform_with_state`` and ``transform_with_state_in_pandas``: PySpark
``StatefulProcessor`` classes, unchanged, with their state in sessionstore.

The input is hash-partitioned by the grouping key and each partition runs the
processor in ``mapInArrow`` through
:class:`~sessionstore.operators.processors.ProcessorRunner`: state lives in the
partition's RocksDB (store kind ``processor``), with the versions, changelogs,
snapshots and exactly-once of every other operator, and a state call is a dict
look-up in the Python worker instead of a round trip to the JVM.

The package, by job:

* :mod:`.operator`: the public functions and the planning on the driver;
* :mod:`.initial_state`: the initial state, routed to the partitions and written
  to the checkpoint once, read by the first batch's tasks;
* :mod:`.task`: the task each partition runs per micro-batch (times, grouping,
  the processor's handle, commit);
* :mod:`.rows` and :mod:`.frames`: the row API's ``Row`` conversion and the
  pandas API's DataFrame conversion, in and out;
* :mod:`.grouping`: runs of equal keys in a sorted batch.

Timers fire in every partition, with or without rows. Unlike Spark, which runs
extra no-data batches for a stateful operator, timers fire at the next
micro-batch the query runs.
"""

from spark_integration.operators.transform_with_state.operator import (
    parse_schema,
    plan_processor,
    transform_with_state,
    transform_with_state_in_pandas,
)
from spark_integration.operators.transform_with_state.task import NOW, STORE, ProcessorTask

__all__ = [
    "transform_with_state",
    "transform_with_state_in_pandas",
    "parse_schema",
    "plan_processor",
    "ProcessorTask",
    "NOW",
    "STORE",
]
