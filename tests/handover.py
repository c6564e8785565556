"""Another process of this user taking partition 0's database of operator ``op``
(tests of handovers between processes): it asks the holder for the database if it
is open there, commits one version, and ends."""

from __future__ import annotations

import subprocess
import sys

TAKE = """
import sys
from sessionstore import StateStoreProvider, StoreSpec
from sessionstore.checkpoint.service.store_service import StoreService
remote, local, version, key = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
specs = [StoreSpec("sessions", "session", 10**12)]
make = lambda: StateStoreProvider(remote, "op", 0, specs, local)
service = StoreService.instance()
with service.provider("op/0", make) as provider:
    handle = provider.get_store(version)
    handle["sessions"].put(key, 1, 2, version)
    handle.commit()
service.close_all()
"""


def take_in_another_process(
    remote: str, local: str, version: int, key: str
) -> subprocess.CompletedProcess:
    """Run :data:`TAKE`: commit ``version`` + 1 with a session of ``key`` (value
    ``version``) from a new process."""
    return subprocess.run(
        [sys.executable, "-c", TAKE, remote, local, str(version), key],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
