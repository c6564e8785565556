"""``make cluster-test``: the demo's streaming job on a Spark standalone cluster,
from the built wheel, against the offline model of its clicks.

    python -m tests.standalone.check --wheel dist/sessionstore-0.1.0-py3-none-any.whl

What it does, every process real and started here:

1. a fresh virtualenv with the wheel installed (not editable), packed as a tar
   archive (tar.gz): what ``spark-submit --archives env.tar.gz#environment`` ships to each
   executor, as Spark's docs describe for Python dependencies (PySpark itself comes
   from the workers' Spark distribution, ``python/lib/pyspark.zip``);
2. a moto S3 server on 127.0.0.1 for the state (``spark.sessionstore.*`` conf);
3. a master and two workers (1 core, 1 GiB each; :mod:`tests.standalone.cluster`);
4. the demo job (``spark_integration.dev.demo`` from the installed wheel) submitted
   with ``--master spark://...``; one executor JVM is killed (SIGKILL) once the
   metrics line of micro-batch :data:`KILL_AFTER_BATCH` is printed;
5. checks: the run's output is exactly what its clicks give offline (the sessions
   emitted and those left in state together are the offline sessionization, each
   once; every click joined with the plan valid at its time: the model
   ``tests/spark/test_demo.py`` holds the ``local[2]`` job to); state servers ran on
   both executors, from the interpreter and packages unpacked in the executor's own
   directory (not this source tree); ``log_state_metrics`` printed a line per
   micro-batch; the kill happened mid-stream, later batches ran, and the
   partitions the dead executor held loaded their state elsewhere (a load that is
   not ``warm``);
6. every process stopped (the cluster's, the driver's, the S3 server), also when a
   step fails; it exits 1 naming each failed check.

Prints the run's throughput (clicks per second of micro-batch time): a check that
the measurement works, not a benchmark (``make bench-cluster`` runs
``bench/cluster.py`` for that, against ``local[2]``).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tarfile
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from sessionstore.tools.demo import click_stream
from spark_integration.dev.demo import GAP_MS, plan_changes
from tests.models import offline_sessions, plan_at
from tests.object_stores import moto_s3_server, new_bucket
from tests.packaging import ROOT, build_dist, clean_env, make_venv
from tests.standalone.cluster import Proc, StandaloneCluster, standalone

__all__ = [
    "ShippedEnv", "ship", "demo_submit_args", "DemoRun", "run_demo", "model_problems", "main",
]  # fmt: skip

#: The cluster run kills an executor once this micro-batch's metrics line is out.
KILL_AFTER_BATCH = 1
#: Where state servers show in a process list.
SERVER_ENTRY = "spark_integration.execution.state_server"
_METRICS_LINE = re.compile(r"^sessionstore (\S+) batch (\d+): .*?load max \S+ \(([^)]*)\)")


@dataclass(frozen=True)
class ShippedEnv:
    """The virtualenv the driver runs, and its packed copy for the executors."""

    python: Path
    archive: Path


#: What executors need besides the wheel's own dependencies: PySpark's
#: ``mapInArrow`` refuses to plan without pandas (PySpark itself comes with Spark).
EXECUTOR_EXTRAS = ["pandas>=2.2,<3"]


def ship(wheel: Path, workdir: Path) -> ShippedEnv:
    """A fresh virtualenv with ``wheel`` (and :data:`EXECUTOR_EXTRAS`) installed,
    and its tar archive."""
    python = make_venv(workdir / "env", [str(wheel), *EXECUTOR_EXTRAS])
    # .tar.gz: Spark unpacks it with the system's tar, which keeps symlinks
    # (bin/python -> the base Python) and modes; a plain .tar goes through its Java
    # code, which keeps neither (the python would not be executable)
    archive = workdir / "env.tar.gz"
    with tarfile.open(archive, "w:gz", compresslevel=1) as tar:
        # entries named as in the venv (no "./": Spark's Java unpacking refuses it)
        for child in sorted((workdir / "env").iterdir()):
            tar.add(child, arcname=child.name)
    return ShippedEnv(python, archive)


def demo_submit_args(
    env: ShippedEnv,
    checkpoint_uri: str,
    storage_options: dict,
    local_dir: str,
    demo_dir: Path,
    output: Path,
    clicks: int,
    batches: int,
    interval: float,
    cluster: bool,
) -> list[str]:
    """``spark-submit`` arguments (after ``--master``) of the demo job: on a cluster
    the executors run the shipped archive's Python; locally the virtualenv's."""
    launcher = demo_dir.parent / "demo_job.py"  # outside any source tree
    launcher.write_text("from spark_integration.dev.demo import main\n\nmain()\n")
    conf = {
        "spark.pyspark.driver.python": str(env.python),
        # client mode: Spark plans a Python data source (the due source) on the
        # driver with spark.pyspark.python, so that names the driver's Python and
        # the SQL conf the executors' (docs/event-time.md, "A driver that can run it")
        "spark.pyspark.python": str(env.python),
        "spark.sql.execution.pyspark.python": (
            "./environment/bin/python" if cluster else str(env.python)
        ),
        "spark.executor.cores": "1",
        "spark.executor.memory": "512m",
        "spark.cores.max": "2",
        "spark.ui.enabled": "false",
        "spark.sessionstore.checkpointUri": checkpoint_uri,
        "spark.sessionstore.localDir": local_dir,
        "spark.sessionstore.snapshotInterval": "3",
        "spark.sessionstore.partitions": "4",
        **{f"spark.sessionstore.storage.{k}": str(v) for k, v in storage_options.items()},
    }
    args = ["--driver-memory", "512m"]
    if cluster:
        args += ["--archives", f"{env.archive}#environment"]
    for key, value in conf.items():
        args += ["--conf", f"{key}={value}"]
    return args + [
        str(launcher), "--clicks", str(clicks), "--users", str(demo_users(clicks)),
        "--batches", str(batches), "--dir", str(demo_dir), "--interval", str(interval),
        "--output", str(output),
    ]  # fmt: skip


@dataclass
class DemoRun:
    """What a submitted demo run left: exit code, output, metrics lines, and what the
    watcher saw (state servers, the executor it killed)."""

    returncode: int
    log: str
    result: dict | None
    #: (operator, batch, loads text, index of the line in the log's metrics lines)
    metrics: list[tuple[str, int, str]] = field(default_factory=list)
    servers: dict[int, Proc] = field(default_factory=dict)
    killed: Proc | None = None
    #: metrics lines printed before the kill
    lines_before_kill: int = 0
    executors_seen: set[str] = field(default_factory=set)


def metrics_lines(log: str) -> list[tuple[str, int, str]]:
    """``(operator, batch, loads)`` of each ``log_state_metrics`` line in ``log``."""
    found = []
    for line in log.splitlines():
        match = _METRICS_LINE.match(line.strip())
        if match:
            found.append((match.group(1), int(match.group(2)), match.group(3)))
    return found


def run_demo(
    cluster: StandaloneCluster,
    args: list[str],
    log: Path,
    output: Path,
    master: str | None = None,
    kill_after_batch: int | None = None,
    timeout: float = 600.0,
) -> DemoRun:
    """Submit the demo, watch it (state servers; the kill), wait for its end."""
    proc = cluster.submit(args, log, master)
    run = DemoRun(returncode=-1, log="", result=None)
    deadline = time.monotonic() + timeout
    while proc.poll() is None:
        if time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            raise TimeoutError(f"the demo did not finish within {timeout:.0f} s; see {log}")
        for p in cluster.processes():
            if any(SERVER_ENTRY in part for part in p.cmdline) and p.pid not in run.servers:
                run.servers[p.pid] = p
        executors = cluster.executors()
        run.executors_seen |= {e.cwd for e in executors}
        if kill_after_batch is not None and run.killed is None and executors:
            seen = metrics_lines(log.read_text(errors="replace"))
            if any(op == "click_sessions" and b >= kill_after_batch for op, b, _ in seen):
                # an executor that ran state servers, so its partitions must move
                busy = {s.cwd for s in run.servers.values()}
                victim = next((e for e in executors if e.cwd in busy), executors[0])
                import os
                import signal

                os.kill(victim.pid, signal.SIGKILL)
                run.killed, run.lines_before_kill = victim, len(seen)
        time.sleep(0.3)
    run.returncode = proc.returncode
    run.log = log.read_text(errors="replace")
    run.metrics = metrics_lines(run.log)
    if output.exists():
        run.result = json.loads(output.read_text())
    return run


def _in_source_tree(entry: Path, source_root: Path) -> bool:
    """Whether a path entry lies in the source tree, outside its virtualenvs."""
    if not entry.is_relative_to(source_root):
        return False
    return not any(part.startswith(".venv") for part in entry.relative_to(source_root).parts)


def _server_problems(servers: dict[int, Proc], source_root: Path) -> list[str]:
    """Each state server must run the executor's unpacked interpreter and import
    sessionstore from the executor's own directory, never from ``source_root``."""
    problems = []
    for server in servers.values():
        where = Path(server.cwd)
        python = Path(server.cmdline[0])
        if not python.is_absolute():
            python = where / python
        if not python.is_relative_to(where) or "environment" not in python.parts:
            problems.append(f"state server {server.pid} runs {python}, not the shipped archive's")
        # relative entries (".") are the server's working directory
        path = [where / p for p in server.env.get("PYTHONPATH", "").split(":") if p]
        # Spark's own pyspark.zip comes from the PySpark distribution that runs the
        # cluster, which may sit in a virtualenv inside the tree (.venv*): not ours
        if any(_in_source_tree(p, source_root) for p in path):
            problems.append(f"state server {server.pid} has the source tree on its path: {path}")
        homes = [p for p in path if (p / "sessionstore" / "__init__.py").exists()]
        if not homes or not homes[0].is_relative_to(where):
            problems.append(
                f"state server {server.pid} imports sessionstore from {homes[:1]}, "
                f"not from its executor's directory {where}"
            )
    return problems


def demo_users(clicks: int) -> int:
    """The users of a demo run of ``clicks`` clicks (:func:`demo_submit_args`)."""
    return max(20, clicks // 60)


def model_problems(result: dict, clicks: int, users: int) -> list[str]:
    """What a demo run's ``--output`` gets wrong against the offline model of its
    ``clicks`` clicks of ``users`` users (empty: nothing)."""
    stream = click_stream(clicks, users)
    emitted = [json.loads(row) for row in result["emitted"]]
    stored = [json.loads(row) for row in result["in_state"]]
    problems = [f"the run has no {part} rows" for part in ("emitted", "in_state", "enriched")
                if not result[part]]  # fmt: skip
    sessions = [(r["user"], r["session_start"], r["session_end"], r["clicks"]) for r in emitted]
    sessions += [(key, start, end, acc[0]) for key, start, end, acc in stored]
    want = offline_sessions([(user, page, ts) for user, ts, page in stream], GAP_MS)
    if sorted(sessions) != want:  # a session emitted and still in state counts twice
        got = Counter(sessions)
        missing, extra = Counter(want) - got, got - Counter(want)
        problems.append(
            f"sessions emitted or in state differ from the offline sessionization: "
            f"{sum(missing.values())} missing (e.g. {sorted(missing)[:2]}), "
            f"{sum(extra.values())} extra (e.g. {sorted(extra)[:2]})"
        )
    enriched = [json.loads(row) for row in result["enriched"]]
    if len(enriched) != clicks:
        problems.append(f"{len(enriched)} clicks joined with their plan, not {clicks}")
    changes = plan_changes(stream, users)
    for row in enriched:
        want_plan = plan_at(changes, row["user"], row["ts"])
        if row["plan"] != want_plan:
            problems.append(f"click {row} joined plan {row['plan']!r}, not {want_plan!r}")
            break
    return problems


def check(remote: DemoRun, clicks: int, batches: int) -> list[str]:
    """The failed checks (empty: all passed)."""
    if remote.returncode != 0 or remote.result is None:
        tail = "\n".join(remote.log.splitlines()[-40:])
        return [f"the cluster run failed (exit {remote.returncode}):\n{tail}"]
    problems = model_problems(remote.result, clicks, demo_users(clicks))
    if "runs without due batches" in remote.log:
        problems.append("the cluster run left its due source out")
    if not remote.result["master"].startswith("spark://"):
        problems.append(f"the cluster run ran on {remote.result['master']}")
    executors = {s.cwd for s in remote.servers.values()}
    if len(executors) < 2:
        problems.append(f"state servers ran on {len(executors)} executor(s): {executors}")
    problems += _server_problems(remote.servers, ROOT)
    sessions = [m for m in remote.metrics if m[0] == "click_sessions"]
    if len({b for _, b, _ in sessions}) < batches:
        problems.append(
            f"log_state_metrics printed {len(sessions)} click_sessions lines "
            f"for {batches} micro-batches"
        )
    if remote.killed is None:
        problems.append("no executor was killed")
    else:
        after = remote.metrics[remote.lines_before_kill :]
        later = [m for m in after if m[0] == "click_sessions"]
        if not later:
            problems.append("the executor was killed after the last micro-batch: not mid-stream")
        moved = [m for m in after if any(k in m[2] for k in ("restore", "replay", "handover"))]
        if not moved:
            problems.append(
                "after the kill no partition loaded its state elsewhere "
                f"(loads after the kill: {[m[2] for m in after]})"
            )
    return problems


def throughput(run: DemoRun) -> str:
    seconds = run.result["seconds"]
    return f"{run.result['clicks'] / seconds:,.0f} clicks/s ({seconds:.1f} s of micro-batches)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheel", type=Path, default=None, help="default: build one")
    parser.add_argument("--clicks", type=int, default=6_000)
    parser.add_argument("--batches", type=int, default=6)
    parser.add_argument("--interval", type=float, default=2.0,
                        help="seconds between micro-batches (room for the kill)")  # fmt: skip
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="sessionstore-cluster-"))
    print(f"work directory {workdir}", flush=True)
    try:
        wheel = args.wheel or build_dist(workdir / "dist")[1]
        started = time.monotonic()
        env = ship(wheel.resolve(), workdir)
        print(f"shipped env: {env.archive} ({env.archive.stat().st_size / 2**20:.0f} MiB, "
              f"{time.monotonic() - started:.0f} s)", flush=True)  # fmt: skip
        with moto_s3_server() as s3, standalone(workdir / "cluster", clean_env()) as cluster:
            output = workdir / "cluster.json"
            submit = demo_submit_args(
                env, f"s3://{new_bucket(s3)}/cluster", s3, "sessionstore-local",
                workdir / "cluster-demo", output, args.clicks, args.batches, args.interval, True,
            )  # fmt: skip
            started = time.monotonic()
            remote = run_demo(
                cluster, submit, workdir / "cluster.log", output, kill_after_batch=KILL_AFTER_BATCH
            )
            print(f"cluster run: exit {remote.returncode}, "
                  f"{time.monotonic() - started:.0f} s", flush=True)  # fmt: skip
        problems = check(remote, args.clicks, args.batches)
        print(f"state servers: {len(remote.servers)} on executors "
              f"{sorted({Path(s.cwd).name for s in remote.servers.values()})}; "
              f"killed executor {remote.killed and Path(remote.killed.cwd).name}; "
              f"executors seen {sorted(Path(e).name for e in remote.executors_seen)}")  # fmt: skip
        for line in remote.log.splitlines():
            if line.startswith("sessionstore click_sessions batch"):
                print("  " + line)
        if not problems:
            print(f"throughput: {throughput(remote)} (with a {args.interval:g} s pause "
                  "excluded and an executor killed: a check, not a benchmark)")  # fmt: skip
    except BaseException:
        print(f"work directory kept: {workdir}", file=sys.stderr)
        raise
    for problem in problems:
        print(f"FAILED: {problem}", file=sys.stderr)
    if problems:
        print(f"work directory kept: {workdir}", file=sys.stderr)
        return 1
    print("cluster check passed: no process left behind")
    if not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
