"""Private local directories: what a partition keeps on local disk is readable and
writable by the job's OS user only.

A local directory shared by users (the system's temporary directory) lets another
user read every partition's state, or plant a directory tree that the job would
then open as its own database. So every directory sessionstore creates for local
state is made with mode 0700, one level at a time (``os.makedirs`` applies its
mode to the last level only), and a directory that already exists is used only if
it is owned by this process's user and nobody else may write to it (no group or
other write bit). Symbolic links are not followed for the check: a link planted in
place of a directory is refused like a foreign directory.
"""

from __future__ import annotations

import os
import stat

from sessionstore.errors import UnsafeLocalDirError

__all__ = ["private_dir", "check_private_dir"]

#: Permission bits that let someone other than the owner change a directory.
_FOREIGN_WRITE = stat.S_IWGRP | stat.S_IWOTH


def check_private_dir(path: str) -> None:
    """Raise :class:`~sessionstore.errors.UnsafeLocalDirError` unless ``path`` is a
    directory owned by this process's user that only it can write to."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise UnsafeLocalDirError(path, "it does not exist") from None
    if not stat.S_ISDIR(st.st_mode):
        kind = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a directory"
        raise UnsafeLocalDirError(path, f"it is {kind}")
    uid = os.geteuid()
    if st.st_uid != uid:
        raise UnsafeLocalDirError(path, f"it is owned by uid {st.st_uid}, not by uid {uid}")
    if st.st_mode & _FOREIGN_WRITE:
        raise UnsafeLocalDirError(
            path, f"its mode {stat.S_IMODE(st.st_mode):04o} lets other users write to it"
        )


def private_dir(path: str, base: str | None = None) -> str:
    """Create ``path`` (mode 0700 for each level created) and check every level from
    ``base`` (default: ``path`` itself) down to it with :func:`check_private_dir`.
    Levels above ``base`` (``/tmp``) are the system's and are not checked."""
    path = os.path.abspath(path)
    base = path if base is None else os.path.abspath(base)
    if os.path.commonpath([base, path]) != base:
        raise ValueError(f"{path!r} is not below {base!r}")
    levels = [path]
    while levels[-1] != base:
        levels.append(os.path.dirname(levels[-1]))
    os.makedirs(os.path.dirname(base), exist_ok=True)  # the user's own path above
    for level in reversed(levels):
        try:
            os.mkdir(level, 0o700)
        except FileExistsError:
            pass
        check_private_dir(level)
    return path
