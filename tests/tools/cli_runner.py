"""The ``sessionstore`` CLI run in the test's own process, as a subprocess would
run it: what it prints on stdout and stderr, and its exit status.

A ``python -m sessionstore.tools.cli`` process spends 0.5-0.9 CPU-s importing
before it does anything, and the suite runs a few hundred of them on two cores.
:func:`run_cli` calls :func:`sessionstore.tools.cli.main` instead, with what a
fresh process would have: stdin, stdout and stderr of its own (no terminal: no
progress display, 80 columns), its own process-wide state
(:func:`sessionstore.process.use_process`: no memory budget, store or warning
marks of the test's), the root logger and warning filters of a new interpreter
(a warning or log line reaches stderr as it would), ``env`` and ``cwd`` for the
call only. Everything is put back after the call; ``os._exit`` (the CLI leaves so
when a store never answers) gives the call its status instead of ending pytest,
and a database the call leaves open fails it. A test whose claim needs a real
process (the installed script, a terminal, memory, signals, a command line seen in
``ps``, reading while a job writes) runs one instead.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import subprocess
import sys
import threading
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path

import click.formatting
from click.testing import CliRunner

from sessionstore.process import Process, use_process
from sessionstore.tools.cli import main

__all__ = ["run_cli"]

#: Columns a process without a terminal gets from ``shutil.get_terminal_size``.
PIPE_COLUMNS = "80"


def run_cli(
    *args: str,
    env: Mapping[str, str | None] | None = None,
    cwd: str | Path | None = None,
    input: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """``sessionstore ARGS...`` in this process, as ``subprocess.run([...],
    capture_output=True, text=True)`` would give it: ``returncode``, ``stdout``
    and ``stderr``. ``env`` sets (a None value removes) environment variables for
    the call, ``cwd`` is its working directory and ``input`` its stdin. An
    exception other than ``SystemExit`` propagates (the process would have
    printed a traceback and exited 1)."""
    overrides = dict(env or {})
    if "COLUMNS" not in overrides and "COLUMNS" not in os.environ:
        overrides["COLUMNS"] = PIPE_COLUMNS  # a pipe has no terminal
    with _own_process() as owner, _restored_environment(cwd), _fresh_logging_and_warnings():
        with CliRunner().isolation(input=input, env=overrides) as (out, err, _):
            click.formatting.FORCED_WIDTH = None  # as a process: the terminal's, else 80
            code = _exit_status(list(args))
            sys.stdout.flush()
            sys.stderr.flush()
    _check_closed(owner, args)
    return subprocess.CompletedProcess(
        ["sessionstore", *args], code, _text(out.getvalue()), _text(err.getvalue())
    )


class _ProcessExit(BaseException):
    """``os._exit(code)`` called by the command: its process would end there."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


@contextlib.contextmanager
def _exit_as_exception() -> Iterator[None]:
    """``os._exit`` in the calling thread raises :class:`_ProcessExit` for the
    call (the CLI leaves so when a store never answers): it would end pytest."""
    real, caller = os._exit, threading.get_ident()

    def leave(code: int) -> None:
        if threading.get_ident() != caller:
            real(code)
        raise _ProcessExit(code)

    os._exit = leave
    try:
        yield
    finally:
        os._exit = real


def _exit_status(argv: list[str]) -> int:
    """``main(argv)``'s exit status, as the interpreter makes it of ``SystemExit``
    (or ``os._exit``)."""
    try:
        with _exit_as_exception():
            main(argv)
    except _ProcessExit as exc:
        return exc.code
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    return 0


def _text(data: bytes) -> str:
    """Bytes as ``subprocess.run(text=True)`` decodes them (universal newlines)."""
    return data.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")


@contextlib.contextmanager
def _own_process() -> Iterator[Process]:
    """A new owner of process-wide state for the call; the test's comes back after.
    Every thread of the test's process sees it meanwhile: no test runs the CLI in
    process while a query's metrics listener, which reads the driver's coordinator
    from the owner, may hear a batch."""
    owner = Process()
    previous = use_process(owner)
    try:
        yield owner
    finally:
        use_process(previous)


@contextlib.contextmanager
def _restored_environment(cwd: str | Path | None) -> Iterator[None]:
    """``cwd`` for the call; the working directory and the whole of ``os.environ``
    as they were after it."""
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    if cwd is not None:
        os.chdir(cwd)
    try:
        yield
    finally:
        os.chdir(saved_cwd)
        if dict(os.environ) != saved_env:
            os.environ.clear()
            os.environ.update(saved_env)


@contextlib.contextmanager
def _fresh_logging_and_warnings() -> Iterator[None]:
    """The root logger and warning filters of a new interpreter: no handlers
    (warnings and errors go to stderr through :data:`logging.lastResort`), level
    WARNING, and the default warning filters printing to stderr."""
    root = logging.getLogger()
    handlers, level, disabled = root.handlers[:], root.level, logging.root.manager.disable
    root.handlers.clear()
    root.setLevel(logging.WARNING)
    logging.disable(logging.NOTSET)
    try:
        with warnings.catch_warnings():
            warnings.resetwarnings()
            for category in (DeprecationWarning, PendingDeprecationWarning, ImportWarning,
                             ResourceWarning):  # fmt: skip
                warnings.filterwarnings("ignore", category=category)
            # the CLI module is __main__ in its own process
            warnings.filterwarnings(
                "default", category=DeprecationWarning, module=r"sessionstore\.tools\.cli"
            )
            warnings.showwarning = _show_warning
            yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
        logging.disable(disabled)


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Print a warning on the current stderr, as the interpreter does."""
    sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


def _check_closed(owner: Process, args: tuple[str, ...]) -> None:
    """Fail if the call left a database open: a process would close it at exit,
    a test's process would keep it (its files, its lock, its memory)."""
    open_databases = owner.get("open_databases")
    if open_databases:
        gc.collect()
    if open_databases:
        raise AssertionError(f"sessionstore {' '.join(args)} left {len(open_databases)} "
                             "database(s) open")  # fmt: skip
