"""What the trust boundaries (docs/security.md) cost per task: a microbenchmark.

Times, median of ``--repeat`` runs on this machine:

* the coordinator round trip a task makes (``report`` after its commit, ``ask``
  answered from the reports) on 127.0.0.1, and, where this checkout signs
  requests, the signing and the verification of one request alone (HMAC-SHA256,
  timestamp, nonce);
* the per-task exchange with a state server (``ServedTask`` running a task that
  echoes a small input, with its metrics record), and the peer-credential check
  a worker now makes before sending;
* the processor state codecs: a value, a list and a map payload encoded and
  decoded with the schema codec (msgpack) and with pickle, as before.

Run it on the branch before the change and after it: the round-trip and exchange
figures exist on both (the parts only the new code has are skipped elsewhere).

Usage: python bench/trust_cost.py [--repeat 300]
"""

from __future__ import annotations

import argparse
import os
import pickle
import socket
import subprocess
import sys
import tempfile
import timeit
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

import pyarrow as pa

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.metrics_cost import best_ms  # noqa: E402


def median_us(fn: Callable[[], object], repeat: int) -> float:
    """The median of ``repeat`` timed calls, in µs (the machine is shared)."""
    return best_ms(fn, repeat) * 1000


def per_call_us(fn: Callable[[], object], number: int = 2000) -> float:
    """timeit's best of 5 rounds of ``number`` calls, per call in µs (CPU-only work)."""
    return min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e6


def coordinator(repeat: int) -> dict[str, float]:
    from spark_integration.coordinator import client, protocol
    from spark_integration.coordinator import server as coord

    c = coord.Coordinator("127.0.0.1", 0)
    try:
        address = c.register(f"file://{tempfile.gettempdir()}/unused-trust-bench", "op", 1)
        record = {"rows_total": 10, "load_kind": "warm", "load_ms": 1.5, "commit_ms": 3.0}
        out = {
            "coordinator report round trip": median_us(
                lambda: client.report(address, "run", 1, 0, 5, record), repeat
            )
        }
        client.report(address, "run", 2, 0, 5, record)
        # ask answered from the reports; the worker's answer cache is bypassed
        out["coordinator ask round trip"] = median_us(
            lambda: (client._answers.clear(), client.ask(address, "run", 2)), repeat
        )
        if hasattr(protocol, "signed_request"):
            message = {"op": "report", "run": "run", "batch": 1, "partition": 0,
                       "event_time": 5, "metrics": record}  # fmt: skip
            out["HMAC: sign one request (client)"] = per_call_us(
                lambda: protocol.signed_request(address.token, message)
            )

            def verify() -> None:
                frame, _ = protocol.signed_request(address.token, message)
                c._verified(bytearray(frame))

            out["HMAC: sign + verify one request"] = per_call_us(verify)
            body = protocol.msgpack.packb(message)
            out["HMAC: the HMAC-SHA256 alone (one side)"] = per_call_us(
                lambda: protocol.mac_of(address.token, body)
            )
    finally:
        c.stop()
    return out


@dataclass
class Echo:
    """A task that returns its input and leaves a metrics record."""

    def run(self, batches, context):
        yield from batches
        context.metrics = {"rows_total": 1, "load_kind": "warm"}


def state_server(repeat: int) -> dict[str, float]:
    from spark_integration.execution import state_server as ss
    from spark_integration.execution.context import TaskContext, TaskInfo
    from spark_integration.execution.state_server import client

    daemon = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    client.daemon_pid = lambda: daemon.pid  # servers end with this stand-in daemon
    try:
        task = ss.ServedTask(Echo(), 1)
        batch = pa.record_batch([pa.array(range(100))], names=["x"])

        def one() -> None:
            for _ in task.run(iter([batch]), TaskContext(TaskInfo(0, 1, 0, "run"))):
                pass

        one()  # starts the server
        out = {"state server: one task's exchange (100 rows)": median_us(one, repeat)}
        from sessionstore.checkpoint.service.request_server import peer_credentials

        a, b = socket.socketpair(socket.AF_UNIX)
        with a, b:
            out["state server: peer-credential check"] = per_call_us(lambda: peer_credentials(a))
    finally:
        daemon.kill()
        daemon.wait()
    return out


def processor_codecs() -> dict[str, float]:
    out: dict[str, float] = {}
    try:
        from sessionstore.encoding.state_values import payload_codec, value_codec
    except ImportError:
        return out

    def schema(*fields: tuple[str, str]) -> dict:
        return {"type": "struct", "fields": [
            {"name": n, "type": t, "nullable": True, "metadata": {}} for n, t in fields
        ]}  # fmt: skip

    long_ = value_codec(schema(("n", "long")))
    typed = value_codec(schema(("ts", "timestamp"), ("amount", "decimal(10,2)")))
    item = value_codec(schema(("item", "string")))
    cases = {
        "value <n long>": ("value", long_, None, ((42,), None)),
        "value <ts timestamp, amount decimal>": (
            "value",
            typed,
            None,
            ((datetime(2024, 1, 1), Decimal("1.50")), None),
        ),
        "list of 3 <item string>": ("list", item, None, [((f"i{i}",), None) for i in range(3)]),
        "map of 20 <item string> -> <n long>": (
            "map",
            long_,
            item,
            {(f"i{i}",): ((i,), 10**12) for i in range(20)},
        ),
    }
    for name, (kind, value, key, payload) in cases.items():
        dumps, loads = payload_codec(kind, value, key)
        raw = dumps(payload)
        pickled = pickle.dumps(payload, protocol=5)
        out[f"codec {name}: msgpack dumps+loads"] = per_call_us(
            lambda dumps=dumps, loads=loads, payload=payload: loads(dumps(payload))
        )
        out[f"codec {name}: pickle dumps+loads"] = per_call_us(
            lambda payload=payload: pickle.loads(pickle.dumps(payload, protocol=5))
        )
        SIZES[name] = (len(raw), len(pickled))
    return out


#: bytes of each codec case: (msgpack, pickle)
SIZES: dict[str, tuple[int, int]] = {}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=300)
    args = parser.parse_args()
    results = {**coordinator(args.repeat), **processor_codecs()}
    if sys.platform.startswith("linux"):
        results.update(state_server(args.repeat))
    for name, value in results.items():
        print(f"{name:60s} {value:10.2f} µs")
    for name, (size, pickled) in SIZES.items():
        print(f"{'bytes ' + name + ': msgpack, pickle':60s} {size:6d} {pickled:6d}")
    print(f"(pid {os.getpid()}; medians of {args.repeat} runs, timeit best of 5 for CPU-only)")


if __name__ == "__main__":
    main()
