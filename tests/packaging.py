"""The released package as a user gets it: the sdist and wheel ``make dist`` builds,
and fresh virtualenvs with the wheel installed (not editable), for the wheel test
(``tests/test_dist.py``) and the standalone-cluster check (``tests/standalone``).

Every process these helpers start for the user's side runs without this source tree
on its path: no ``PYTHONPATH``, a working directory outside the tree. The other
side, a child that must import this checkout, gets :func:`checkout_pythonpath`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

__all__ = [
    "ROOT",
    "WHEEL_ENV",
    "build_dist",
    "wheel_from_env",
    "wheel_files",
    "make_venv",
    "clean_env",
    "checkout_pythonpath",
]

ROOT = Path(__file__).resolve().parents[1]
#: A wheel built beforehand (``make dist``); the tests then use it instead of
#: building one.
WHEEL_ENV = "SESSIONSTORE_WHEEL"


def build_dist(outdir: Path) -> tuple[Path, Path]:
    """``python -m build`` of the repository into ``outdir`` (an sdist, then a wheel
    built from that sdist, as ``make dist`` does): ``(sdist, wheel)``."""
    outdir.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(outdir), str(ROOT)],
        capture_output=True, text=True, timeout=600, env=clean_env(),
    )  # fmt: skip
    if proc.returncode:
        raise RuntimeError(f"python -m build failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    (sdist,) = outdir.glob("sessionstore-*.tar.gz")
    (wheel,) = outdir.glob("sessionstore-*.whl")
    return sdist, wheel


def wheel_from_env() -> Path | None:
    """The wheel named by :data:`WHEEL_ENV`, if set (it must exist)."""
    value = os.environ.get(WHEEL_ENV)
    if not value:
        return None
    path = Path(value).resolve()
    if not path.is_file():
        raise FileNotFoundError(f"{WHEEL_ENV}={value!r}: no such wheel")
    return path


def wheel_files(wheel: Path) -> list[str]:
    """The names of the files in ``wheel``."""
    with zipfile.ZipFile(wheel) as archive:
        return archive.namelist()


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without anything that would put this source tree
    or the development virtualenv on a child's path."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")
        and not key.startswith(("PYSPARK_", "SPARK_"))
    }
    # the venv's own bin first; nothing of the development virtualenv
    dev_bin = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join(
        p for p in env.get("PATH", "").split(os.pathsep) if p and p != dev_bin
    )
    env.update(extra)
    return env


def checkout_pythonpath() -> str:
    """``PYTHONPATH`` for a child that imports this checkout: its root, then this
    run's own (tests/conftest.py puts the suite's worker site there)."""
    return os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))


def make_venv(path: Path, requirements: list[str], own_pip: bool = True) -> Path:
    """A fresh virtualenv at ``path`` (on this interpreter's base Python) with
    ``requirements`` pip-installed (a wheel path, optionally with extras, and any
    other requirement): its ``python``.

    ``own_pip=False`` makes it without pip and installs with this interpreter's pip
    (``--python``), without byte-compiling at install: for an environment that only
    runs what it imports (compiled then), not one shipped elsewhere, as the
    cluster check's is, which its executors run many times over."""
    venv.EnvBuilder(with_pip=own_pip, clear=True).create(path)
    python = path / "bin" / "python"
    pip = [str(python), "-m", "pip"] if own_pip else [sys.executable, "-m", "pip", "--python", str(python)]
    args = [] if own_pip else ["--no-compile"]
    proc = subprocess.run(
        [*pip, "install", "--quiet", *args, "--disable-pip-version-check", *requirements],
        capture_output=True, text=True, timeout=900, env=clean_env(), cwd=path,
    )  # fmt: skip
    if proc.returncode:
        raise RuntimeError(f"pip install {requirements} failed:\n{proc.stderr[-3000:]}")
    return python
