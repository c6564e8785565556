"""A StatefulProcessor's state as Spark's ``statestore`` reader shows a
transformWithState operator's: the rows of one state variable, or the registered
timers, of a processor store.

Shared by ``sessionstore dump --state-var`` and the ``sessionstore`` data source
(``.option("stateVarName", ...)``), so the two agree row for row. Each row holds
``partition`` and ``key`` (the grouping key) and, by the variable's kind, the
columns of Spark's reader (``flattenCollectionTypes`` true, the default, or false):

=======  =============================================  ===========================
kind     flattened                                      not flattened
=======  =============================================  ===========================
value    ``value``                                      (the same)
list     ``list_element``: one row per element          ``list_value``: a list
map      ``user_map_key``, ``user_map_value``: one row  ``map_value``: a list of
         per entry                                      ``[user key, value]``
timers   ``expiration_timestamp_ms``: one row per timer (the same)
=======  =============================================  ===========================

A value is a tuple with one item per field of the declared schema (nested structs
tuples too, arrays lists, maps dicts), a user key a tuple, as the variable's
recorded declaration decodes them. A variable with a TTL wraps each value, as
Spark's reader does, as ``{"value": value, "ttlExpirationMs": epoch ms}``.
Expired values that cleanup has not removed yet are shown, as the store holds them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

__all__ = ["variable_rows", "timer_rows", "has_ttl", "TTL_FIELD"]

#: The field of a TTL variable's value that holds its expiry (Spark's name).
TTL_FIELD = "ttlExpirationMs"


def _value(item: dict[str, Any], ttl: bool) -> Any:
    value = tuple(item["value"])
    return {"value": value, TTL_FIELD: item["expires_ms"]} if ttl else value


def variable_rows(
    rows: Iterator[dict[str, Any]], variable: str, kind: str, ttl: bool, flatten: bool = True
) -> Iterator[dict[str, Any]]:
    """The rows of state variable ``variable`` (of ``kind`` value, list or map;
    ``ttl``: whether it has a TTL) from a processor store's reader rows
    (``store_rows``: one per key and variable), in the layout of the module doc."""
    if kind not in ("value", "list", "map"):
        raise ValueError(f"state variable {variable!r} is of kind {kind!r}: not value, list or map")
    for row in rows:
        if row["state"] != variable:
            continue
        head = {"partition": row["partition"], "key": row["key"]}
        stored = row["value"]
        if kind == "value":
            yield {**head, "value": _value(stored, ttl)}
        elif kind == "list" and flatten:
            for item in stored:
                yield {**head, "list_element": _value(item, ttl)}
        elif kind == "list":
            yield {**head, "list_value": [_value(item, ttl) for item in stored]}
        elif flatten:
            for e in stored:
                yield {**head, "user_map_key": tuple(e["key"]), "user_map_value": _value(e, ttl)}
        else:
            yield {**head, "map_value": [[tuple(e["key"]), _value(e, ttl)] for e in stored]}


def has_ttl(rows: Iterator[dict[str, Any]], variable: str) -> bool:
    """Whether ``variable`` has a TTL, by its first stored value (every value of
    a TTL variable has an expiry), for declarations recorded without saying so."""
    for row in rows:
        if row["state"] == variable:
            stored = row["value"]
            first = stored if isinstance(stored, dict) else stored[0]
            return first["expires_ms"] is not None
    return False


def timer_rows(rows: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """One row per registered timer (``expiration_timestamp_ms``, epoch ms) of each
    key, from a processor store's reader rows, in key then time order."""
    for row in rows:
        if row["state"] is None:  # the key's timer list
            for time in row["value"]:
                yield {"partition": row["partition"], "key": row["key"],
                       "expiration_timestamp_ms": time}  # fmt: skip
