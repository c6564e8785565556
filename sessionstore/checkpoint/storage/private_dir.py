"""Private local directories: what a partition keeps on local disk is readable and
writable by the job's OS user only.

A local directory shared by users (the system's temporary directory) lets another
user read every partition's state, or plant a directory tree that the job would
then open as its own database. So every directory sessionstore creates for local
state is made with mode 0700, one level at a time (``os.makedirs`` applies its
mode to the last level only), and a directory that already exists is used only if
it is owned by this process's user and nobody else has any access to it (no group
or other permission bit: read would show the state, write would plant it).
Symbolic links are not followed for the check: a link planted in place of a
directory is refused like a foreign directory.

The default local dirs live in one folder per OS user, :func:`user_root`
(``<tmp>/sessionstore-local-<uid>``), checked from that folder down: in a shared
``/tmp`` another user could create it first, and whoever owns it can later swap
any folder below it for a link. The check runs whenever a database is opened
(not per warm task), before a restore puts a database in place, before a commit
takes a local snapshot and before maintenance locks the partition.
"""

from __future__ import annotations

import os
import stat
import tempfile

from sessionstore.errors import UnsafeLocalDirError

__all__ = ["private_dir", "check_private_dir", "user_root"]

#: Permission bits that give someone other than the owner any access.
_FOREIGN_ACCESS = stat.S_IRWXG | stat.S_IRWXO


def user_root() -> str:
    """This OS user's folder for default local dirs: ``<tmp>/sessionstore-local-<uid>``."""
    return os.path.join(tempfile.gettempdir(), f"sessionstore-local-{os.geteuid()}")


def _user_name(uid: int) -> str:
    """``uid`` with its user name where the system knows it: ``65534 ('nobody')``."""
    try:
        import pwd

        return f"{uid} ({pwd.getpwuid(uid).pw_name!r})"
    except (ImportError, KeyError):
        return str(uid)


def check_private_dir(path: str) -> None:
    """Raise :class:`~sessionstore.errors.UnsafeLocalDirError` unless ``path`` is a
    directory (not a link) owned by this process's user that no one else may
    read, enter or write."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise UnsafeLocalDirError(path, "it does not exist") from None
    if not stat.S_ISDIR(st.st_mode):
        kind = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a directory"
        raise UnsafeLocalDirError(path, f"it is {kind}")
    uid = os.geteuid()
    if st.st_uid != uid:
        raise UnsafeLocalDirError(
            path,
            f"it is owned by uid {_user_name(st.st_uid)}, not by uid {_user_name(uid)} (another "
            "user made it first, and could swap what is below it); its owner or root must "
            "remove it, or set local_dir (spark.sessionstore.localDir) to a directory of yours",
        )
    if st.st_mode & _FOREIGN_ACCESS:
        mode = stat.S_IMODE(st.st_mode)
        raise UnsafeLocalDirError(
            path,
            f"its mode {mode:04o} gives other users access (read shows the state, write "
            "plants it); chmod go-rwx it",
        )


def private_dir(path: str, base: str | None = None) -> str:
    """Create ``path`` (mode 0700 for each level created) and check every level from
    ``base`` (default: ``path`` itself) down to it with :func:`check_private_dir`;
    from :func:`user_root` down when ``base`` is below it. Levels above (``/tmp``)
    are the system's and are not checked."""
    path = os.path.abspath(path)
    base = path if base is None else os.path.abspath(base)
    if os.path.commonpath([base, path]) != base:
        raise ValueError(f"{path!r} is not below {base!r}")
    root = os.path.abspath(user_root())
    if base != root and os.path.commonpath([root, base]) == root:
        base = root  # the per-user folder is what keeps other users out
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
