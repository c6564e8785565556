"""A Spark standalone cluster on 127.0.0.1: a master and workers as separate
processes, started from the PySpark distribution's own scripts
(``bin/spark-class org.apache.spark.deploy.master.Master`` / ``...worker.Worker``),
and ``spark-submit`` against it.

Every process it starts carries one environment variable, :data:`MARKER`, whose
value names this cluster; executors, Python workers, state servers and the
submitted driver inherit it. :meth:`StandaloneCluster.stop` ends every process of
the machine that carries this cluster's value (each by its pid, SIGTERM then
SIGKILL) and checks that none is left, so nothing outlives the cluster, whatever
failed.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "MARKER", "StandaloneCluster", "Proc", "spark_home", "processes_of", "end_processes",
    "standalone", "free_port",
]  # fmt: skip

#: The environment variable that tags every process of a cluster (value: its id).
MARKER = "SESSIONSTORE_CLUSTER"
#: The JVM class of a standalone executor.
EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"


def spark_home() -> Path:
    """The PySpark distribution (its ``bin/``, ``jars/`` and ``python/lib``)."""
    import pyspark

    return Path(os.environ.get("SPARK_HOME") or Path(pyspark.__file__).parent)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass(frozen=True)
class Proc:
    """A running process: its pid, command line, working directory and environment."""

    pid: int
    cmdline: list[str]
    cwd: str
    env: dict[str, str]


def _read_proc(pid: int) -> Proc | None:
    base = Path("/proc") / str(pid)
    try:
        cmdline = (base / "cmdline").read_bytes().split(b"\0")
        environ = (base / "environ").read_bytes().split(b"\0")
        cwd = os.readlink(base / "cwd")
    except OSError:  # gone, or not ours to read
        return None
    env = {}
    for item in environ:
        key, sep, value = item.decode(errors="replace").partition("=")
        if sep:
            env[key] = value
    return Proc(pid, [c.decode(errors="replace") for c in cmdline if c], cwd, env)


def processes_of(cluster_id: str) -> list[Proc]:
    """Every process of this machine tagged with ``cluster_id`` (see :data:`MARKER`)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            proc = _read_proc(int(entry))
            if proc is not None and proc.env.get(MARKER) == cluster_id:
                found.append(proc)
    return found


def end_processes(
    cluster_id: str, grace: float = 10.0, reap: Callable[[], None] = lambda: None
) -> list[Proc]:
    """End every process tagged with ``cluster_id``, each by its pid: SIGTERM, then
    SIGKILL after ``grace`` seconds (``reap`` collects the exit status of the
    caller's own children meanwhile); return those still there (none, normally)."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        for proc in processes_of(cluster_id):
            try:
                os.kill(proc.pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        while processes_of(cluster_id) and time.monotonic() < deadline:
            reap()
            time.sleep(0.2)
        if not processes_of(cluster_id):
            break
    return processes_of(cluster_id)


class StandaloneCluster:
    """A master and ``workers`` workers of ``cores`` cores and ``memory`` each, with
    their logs and work directories under ``workdir``; ``env`` is the environment
    every process starts from (the marker is added)."""

    def __init__(
        self,
        workdir: Path,
        env: dict[str, str],
        workers: int = 2,
        cores: int = 1,
        memory: str = "1g",
    ) -> None:
        self.workdir = workdir
        self.id = uuid.uuid4().hex
        self.env = {**env, MARKER: self.id, "SPARK_LOCAL_IP": "127.0.0.1"}
        self.workers, self.cores, self.memory = workers, cores, memory
        self.home = spark_home()
        self.port = free_port()
        self.ui_port = free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self._started: list[subprocess.Popen] = []

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen:
        log = open(self.workdir / f"{name}.log", "wb")
        try:
            proc = subprocess.Popen(
                [str(self.home / "bin" / "spark-class"), *args],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=self.env, cwd=self.workdir, start_new_session=True,
            )  # fmt: skip
        finally:
            log.close()
        self._started.append(proc)
        return proc

    def start(self, timeout: float = 90.0) -> None:
        """Start the master, then the workers; return once every worker is ALIVE."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._spawn("master", [
            "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
            "--port", str(self.port), "--webui-port", str(self.ui_port),
        ])  # fmt: skip
        for n in range(self.workers):
            work = self.workdir / f"worker-{n}"
            work.mkdir(exist_ok=True)
            self._spawn(f"worker-{n}", [
                "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                "--port", str(free_port()), "--webui-port", str(free_port()),
                "--cores", str(self.cores), "--memory", self.memory,
                "--work-dir", str(work), self.url,
            ])  # fmt: skip
        deadline = time.monotonic() + timeout
        while len(self.alive_workers()) < self.workers:
            for proc in self._started:
                if proc.poll() is not None:
                    raise RuntimeError(
                        f"{proc.args[1]} exited with {proc.returncode}; see {self.workdir}/*.log"
                    )
            if time.monotonic() > deadline:
                raise TimeoutError(f"the workers did not register within {timeout:.0f} s")
            time.sleep(0.5)

    def state(self) -> dict:
        """The master's JSON status (workers, applications)."""
        url = f"http://127.0.0.1:{self.ui_port}/json/"
        with urllib.request.urlopen(url, timeout=5) as resp:
            return json.loads(resp.read())

    def alive_workers(self) -> list[dict]:
        try:
            return [w for w in self.state().get("workers", []) if w.get("state") == "ALIVE"]
        except OSError:
            return []

    def processes(self) -> list[Proc]:
        """Every process of this cluster (master, workers, executors, Python workers,
        state servers, a submitted driver)."""
        return processes_of(self.id)

    def executors(self) -> list[Proc]:
        """The executor JVMs running now."""
        return [p for p in self.processes() if EXECUTOR_CLASS in p.cmdline]

    def submit(self, args: list[str], log: Path, master: str | None = None) -> subprocess.Popen:
        """``spark-submit --master <this cluster> args``, its output to ``log``, tagged
        as part of the cluster (stopped with it)."""
        out = open(log, "wb")
        try:
            proc = subprocess.Popen(
                [str(self.home / "bin" / "spark-submit"), "--master", master or self.url, *args],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env={**self.env, "PYTHONUNBUFFERED": "1"}, cwd=self.workdir,
                start_new_session=True,
            )  # fmt: skip
        finally:
            out.close()
        self._started.append(proc)
        return proc

    def stop(self, grace: float = 10.0) -> list[Proc]:
        """End every process of the cluster: SIGTERM, then SIGKILL after ``grace``
        seconds; return the processes still there after that (none, normally)."""
        left = end_processes(self.id, grace, self._reap)
        self._reap()
        return left

    def _reap(self) -> None:
        for proc in self._started:
            proc.poll()


@contextmanager
def standalone(workdir: Path, env: dict[str, str], **kwargs) -> Iterator[StandaloneCluster]:
    """A started :class:`StandaloneCluster`, stopped (every process) when the block
    ends, also on an error or a SIGTERM to this process; ``RuntimeError`` if a
    process survived the stop."""
    cluster = StandaloneCluster(workdir, env, **kwargs)
    previous = signal.getsignal(signal.SIGTERM)

    def terminated(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, terminated)
    try:
        cluster.start()
        yield cluster
    finally:
        left = cluster.stop()
        signal.signal(signal.SIGTERM, previous)
        if left:
            raise RuntimeError(f"processes survived the cluster's stop: {left}")
