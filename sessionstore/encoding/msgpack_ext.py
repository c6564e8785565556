"""msgpack extension types for the values of Spark's types msgpack lacks.

A row of a Spark DataFrame, read from Arrow, holds ``datetime`` (timestamps, naive
for ``timestamp_ntz``, aware for ``timestamp``), ``date``, ``Decimal`` and
``timedelta`` (day-time intervals) values. Every msgpack form this library writes
(the default value serde, the generic form of a processor's state) packs them as
these extension types, so any row a user hands an operator can be stored, and
reads back as the same Python value:

==========================  ====  ================================================
Python value                code  payload
==========================  ====  ================================================
naive ``datetime``          1     int64 microseconds of the wall clock since
                                  1970-01-01, big-endian
aware ``datetime``          2     msgpack ``[microseconds since the epoch in UTC,
                                  UTC offset in seconds]`` (read back with a fixed
                                  offset zone)
``date``                    3     int64 days since 1970-01-01, big-endian
``Decimal``                 4     its text, UTF-8
``timedelta``               5     int64 microseconds, big-endian
``time`` (no zone)          6     int64 microseconds since midnight, big-endian
==========================  ====  ================================================

Codes 1-6 are taken: a ``msgpack.ExtType`` of one of them that a program stores
itself reads back as the value above, or is refused (``ValueError`` naming the code
and the payload) where its payload is not one of these forms; any other extension
code reads back as a ``msgpack.ExtType``, untouched.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import date, datetime, time, timedelta, timezone
from decimal import Decimal
from typing import Any

import msgpack

__all__ = [
    "EXT_DATETIME",
    "EXT_AWARE_DATETIME",
    "EXT_DATE",
    "EXT_DECIMAL",
    "EXT_TIMEDELTA",
    "EXT_TIME",
    "EPOCH",
    "EPOCH_ORDINAL",
    "micros",
    "ext_default",
    "ext_hook",
]

EXT_DATETIME, EXT_AWARE_DATETIME, EXT_DATE, EXT_DECIMAL, EXT_TIMEDELTA = 1, 2, 3, 4, 5
#: Spark's ``time`` type (4.1+), a wall-clock time of day without a zone.
EXT_TIME = 6

#: 1970-01-01 as a naive datetime, and as a proleptic Gregorian ordinal.
EPOCH = datetime(1970, 1, 1)
EPOCH_ORDINAL = EPOCH.toordinal()
_US = timedelta(microseconds=1)


def micros(delta: timedelta) -> int:
    """``delta`` in whole microseconds."""
    return delta // _US


def ext_default(obj: Any) -> Any:
    """msgpack's ``default``: the extension type of a datetime, date, Decimal,
    timedelta or time of day; ``TypeError`` naming anything else."""
    if isinstance(obj, datetime):
        if obj.tzinfo is None:
            return msgpack.ExtType(
                EXT_DATETIME, micros(obj - EPOCH).to_bytes(8, "big", signed=True)
            )
        offset = obj.utcoffset() or timedelta(0)
        utc = obj.replace(tzinfo=None) - offset
        return msgpack.ExtType(
            EXT_AWARE_DATETIME,
            msgpack.packb([micros(utc - EPOCH), offset // timedelta(seconds=1)]),
        )
    if isinstance(obj, date):
        return msgpack.ExtType(
            EXT_DATE, (obj.toordinal() - EPOCH_ORDINAL).to_bytes(8, "big", signed=True)
        )
    if isinstance(obj, Decimal):
        return msgpack.ExtType(EXT_DECIMAL, str(obj).encode())
    if isinstance(obj, timedelta):
        return msgpack.ExtType(EXT_TIMEDELTA, micros(obj).to_bytes(8, "big", signed=True))
    if isinstance(obj, time) and obj.tzinfo is None:
        of_day = ((obj.hour * 60 + obj.minute) * 60 + obj.second) * 1_000_000 + obj.microsecond
        return msgpack.ExtType(EXT_TIME, of_day.to_bytes(8, "big", signed=True))
    raise TypeError(
        f"cannot store {type(obj).__name__} {obj!r} in state: not a value of a Spark type"
    )


def _int64(data: bytes) -> int:
    if len(data) != 8:
        raise ValueError(f"{len(data)} bytes, not 8")
    return int.from_bytes(data, "big", signed=True)


def _aware(data: bytes) -> datetime:
    stamp, offset = msgpack.unpackb(data)
    tz = timezone(timedelta(seconds=offset))
    return (EPOCH + timedelta(microseconds=stamp + offset * 1_000_000)).replace(tzinfo=tz)


def _time(data: bytes) -> time:
    seconds, micro = divmod(_int64(data), 1_000_000)
    return time(seconds // 3600, seconds // 60 % 60, seconds % 60, micro)


#: How each extension code's payload reads back (the inverse of :func:`ext_default`).
_DECODE: dict[int, Callable[[bytes], Any]] = {
    EXT_DATETIME: lambda data: EPOCH + timedelta(microseconds=_int64(data)),
    EXT_AWARE_DATETIME: _aware,
    EXT_DATE: lambda data: date.fromordinal(EPOCH_ORDINAL + _int64(data)),
    EXT_DECIMAL: lambda data: Decimal(data.decode()),
    EXT_TIMEDELTA: lambda data: timedelta(microseconds=_int64(data)),
    EXT_TIME: _time,
}


def ext_hook(code: int, data: bytes) -> Any:
    """msgpack's ``ext_hook``: the value :func:`ext_default` packed as ``code``;
    ``ValueError`` naming the code and the payload where the payload is not one
    (a value this library did not write, a corrupt file): a stored value that
    cannot be read is refused, never read as another."""
    decode = _DECODE.get(code)
    if decode is None:
        return msgpack.ExtType(code, data)  # unknown: kept as data
    try:
        return decode(data)
    except (ValueError, TypeError, ArithmeticError) as error:
        raise ValueError(
            f"malformed msgpack extension {code} value {data[:40]!r} ({error})"
        ) from None
