"""Process-wide state has one owner (sessionstore.process): its slots are made once
per process, a forked child starts with empty slots but keeps the once-per-process
marks, and no other module keeps process state in a module global."""

from __future__ import annotations

import ast
import os
import pathlib

import pytest

from sessionstore.process import SLOTS, Process, reset_process, this_process

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_a_slot_is_made_once_and_a_failed_make_leaves_it_empty():
    process = Process()
    made = []

    def make():
        made.append(1)
        return {"n": len(made)}

    assert process.get("parallelism") is None
    first = process.get_or_make("parallelism", make)
    assert process.get_or_make("parallelism", make) is first == {"n": 1}
    assert made == [1]

    def refuse():
        raise OSError("address in use")

    with pytest.raises(OSError, match="address in use"):
        process.get_or_make("coordinator", refuse)
    assert process.get("coordinator") is None
    assert process.get_or_make("coordinator", lambda: "started") == "started"


def test_threads_racing_for_a_slot_get_the_one_object_made_once():
    import threading
    import time

    process, made, got = Process(), [], []
    start = threading.Barrier(8)

    def make():
        made.append(1)
        time.sleep(0.05)  # the others arrive while it is being made
        return object()

    def race():
        start.wait()
        got.append(process.get_or_make("helper_thread", make))

    threads = [threading.Thread(target=race) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert made == [1] and len(got) == 8 and len({id(g) for g in got}) == 1


def test_an_unknown_slot_is_refused_by_name():
    with pytest.raises(KeyError, match="no process-wide slot 'budget'.*'memory_budget'"):
        Process().get("budget")
    with pytest.raises(KeyError, match="'helper'"):
        Process().get_or_make("helper", dict)


def test_marks_are_once_per_kind_and_key_and_forgotten_by_kind():
    process = Process()
    assert process.first_time("warn", "a") and not process.first_time("warn", "a")
    assert process.first_time("warn", "b") and process.first_time("other")
    assert process.marked("warn", "a") and not process.marked("warn", "c")
    process.mark("reached", "s3://x")
    process.forget("warn")
    assert not process.marked("warn", "a") and not process.marked("warn", "b")
    assert process.marked("other") and process.marked("reached", "s3://x")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_gets_empty_slots_and_keeps_the_parents_marks():
    parent = this_process()
    budget = parent.get_or_make("parallelism", dict)
    parent.mark("test_fork", "seen")

    def child() -> tuple[bool, ...]:
        own = this_process()
        return (
            own is not parent,
            own.pid == os.getpid(),
            own.get("parallelism") is None,
            own.marked("test_fork", "seen"),
            own.get_or_make("parallelism", dict) is not budget,
        )

    assert _in_child(child) == [1, 1, 1, 1, 1]
    assert this_process() is parent and parent.get("parallelism") is budget
    parent.forget("test_fork")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_reset_gives_the_process_a_new_owner_with_nothing_in_it():
    def child() -> tuple[bool, ...]:  # in a child: the suite's owner stays as it is
        before = this_process()
        before.get_or_make("parallelism", dict)
        before.mark("test_reset")
        fresh = reset_process()
        return (
            fresh is this_process() is not before,
            fresh.get("parallelism") is None,
            not fresh.marked("test_reset"),
        )

    assert _in_child(child) == [1, 1, 1]


def _in_child(check) -> list[int]:
    """``check()``'s booleans, computed in a forked child."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.write(write, bytes(int(v) for v in check()))
        finally:
            os._exit(0)
    os.close(write)
    try:
        return list(os.read(read, 64))
    finally:
        os.close(read)
        os.waitpid(pid, 0)


def _module_globals(path: pathlib.Path) -> list[str]:
    """``global`` statements of a module: module state a function rebinds."""
    return [
        f"{path.relative_to(ROOT)}: {', '.join(node.names)}"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Global)
    ]


def test_no_module_but_the_owner_rebinds_process_state():
    found = [
        line
        for package in ("sessionstore", "spark_integration")
        for path in sorted((ROOT / package).rglob("*.py"))
        if path != ROOT / "sessionstore" / "process.py"
        for line in _module_globals(path)
    ]
    assert found == []


def test_every_slot_names_the_module_that_uses_it():
    for slot, module in SLOTS.items():
        path = ROOT / (module.replace(".", "/") + ".py")
        assert f'"{slot}"' in path.read_text(), (slot, module)
