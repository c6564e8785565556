"""Exception types that carry the facts a user needs to act."""

from __future__ import annotations

__all__ = [
    "SessionStoreError",
    "StoreSpecMismatchError",
    "StateDBLockedError",
    "StateDBPathError",
    "StatefulProcessorError",
    "UnsafeLocalDirError",
    "PickleRefusedError",
]


class SessionStoreError(Exception):
    """Base class of every error raised by sessionstore."""


class StoreSpecMismatchError(SessionStoreError, ValueError):
    """A store was reopened with a kind or layout different from the recorded one."""

    def __init__(self, store: str, field: str, recorded: object, requested: object) -> None:
        self.store, self.field = store, field
        self.recorded, self.requested = recorded, requested
        super().__init__(
            f"store {store!r} was created with {field}={recorded!r} but is now opened with "
            f"{field}={requested!r}; open it with the recorded {field} or use a new store name"
        )


class StateDBLockedError(SessionStoreError):
    """Another process (or an unclosed handle in this one) holds the RocksDB lock."""

    def __init__(self, path: str, detail: str) -> None:
        self.path = path
        super().__init__(
            f"state database {path!r} is locked by another open handle ({detail}); "
            "close the other handle, or read a copy or checkpoint instead"
        )


class StateDBPathError(SessionStoreError, OSError):
    """A state database cannot live at the given path (a file, under a file, not
    writable, ...). ``problem`` says why."""

    def __init__(self, path: str, problem: str) -> None:
        self.path, self.problem = path, problem
        super().__init__(f"cannot open state database {path!r}: {problem}")


class StatefulProcessorError(SessionStoreError):
    """A StatefulProcessor misused its handle or state, or gave a bad value.

    ``error_class`` is Spark's error condition for the same misuse (for example
    ``STATEFUL_PROCESSOR_CANNOT_PERFORM_OPERATION_WITH_INVALID_HANDLE_STATE``), and
    the message starts with it in brackets, as Spark's messages do, so code that
    matches Spark's errors matches these."""

    def __init__(self, error_class: str, message: str) -> None:
        self.error_class = error_class
        super().__init__(f"[{error_class}] {message}")


class UnsafeLocalDirError(SessionStoreError, PermissionError):
    """A local state directory another user owns or may access: its contents
    could be planted or read by that user, so it is not used."""

    def __init__(self, path: str, problem: str) -> None:
        self.path, self.problem = path, problem
        super().__init__(
            f"refusing local state directory {path!r}: {problem}; use a directory of "
            "your own that only you can access (mode 0700), or remove this one"
        )


class PickleRefusedError(SessionStoreError):
    """A reader met a store whose recorded serde is pickle: reading it would run
    whatever code the checkpoint's writer put there. ``option`` is how to opt in."""

    def __init__(self, store: str, where: str, option: str) -> None:
        self.store, self.where, self.option = store, where, option
        super().__init__(
            f"store {store!r} of {where} is pickled, and unpickling runs code from the "
            f"checkpoint; pass {option} only if you trust every writer of this checkpoint"
        )
