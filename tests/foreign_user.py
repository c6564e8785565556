"""Run a function as another OS user (``nobody``) in a forked child, for tests of
the boundaries that must not trust other local users. Needs root (the tests that
use it are skipped otherwise)."""

from __future__ import annotations

import os
import pickle
import traceback
from collections.abc import Callable
from typing import Any

import pytest

#: uid and gid of ``nobody`` on Debian and most Linux systems
NOBODY = 65534

needs_root = pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0,
    reason="needs root to act as another user (setuid nobody)",
)


class AsNobody:
    """``fn(ready)`` running as ``nobody`` in a forked child: the child calls
    ``ready()`` once it is set up (for example bound to a socket); :meth:`result`
    waits for its return value (picklable, passed back over a pipe)."""

    def __init__(self, fn: Callable[[Callable[[], None]], Any]) -> None:
        ready_r, ready_w = os.pipe()
        out_r, out_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: never returns into pytest
            code = 0
            try:
                os.close(ready_r)
                os.close(out_r)
                os.setgroups([])
                os.setgid(NOBODY)
                os.setuid(NOBODY)
                result = fn(lambda: os.write(ready_w, b"1"))
                data = pickle.dumps(("ok", result))
            except BaseException:
                data = pickle.dumps(("error", traceback.format_exc()))
                code = 1
            with os.fdopen(out_w, "wb") as out:
                out.write(data)
            os._exit(code)
        os.close(ready_w)
        os.close(out_w)
        self.pid, self._ready, self._out = pid, ready_r, out_r

    def wait_ready(self) -> None:
        """Block until the child called ``ready()`` (or ended)."""
        os.read(self._ready, 1)
        os.close(self._ready)

    def result(self) -> Any:
        """The child's return value; AssertionError with its traceback if it raised."""
        with os.fdopen(self._out, "rb") as out:
            data = out.read()
        os.waitpid(self.pid, 0)
        status, value = pickle.loads(data) if data else ("error", "the child died")
        assert status == "ok", value
        return value
