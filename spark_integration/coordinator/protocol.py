"""The coordinator's wire: signed, length-prefixed msgpack frames between a task
(:mod:`spark_integration.coordinator.client`) and the driver's coordinator
(:mod:`spark_integration.coordinator.server`), and the address a task is given.

Wire format (docs/security.md, "Coordinator"). A request is
``length u32 ‖ msgpack [key id, body, mac]``:

* ``key id``: 16 hex digits of SHA-256 of the operator's token (names the key,
  reveals nothing of it);
* ``body``: msgpack map of the request (``op``, ``run``, ``batch``, ...) with
  ``ts`` (the sender's Unix time in ms) and ``nonce`` (16 random bytes);
* ``mac``: HMAC-SHA256 of ``body`` keyed by the token.

The coordinator drops, unanswered, a request whose mac is wrong, whose ``ts`` is
more than :data:`MAX_CLOCK_SKEW_S` from its clock, or whose nonce it has seen (it
remembers nonces as long as their timestamps are acceptable, at most
:data:`MAX_NONCES`; when it forgets one early, no request as old is taken any
more). A reply is ``length u32 ‖ msgpack [body, mac]`` with the mac over
``b"reply" ‖ request nonce ‖ body``, so a task takes only the answer to its own
request from the coordinator that holds the token. A report whose fields are out
of range, or whose metrics record has unknown fields or is larger than
:data:`MAX_METRICS_BYTES`, is dropped, and each kind of refusal is logged once.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import os
import struct
import time
from dataclasses import dataclass
from typing import Any

import msgpack

from sessionstore.errors import SessionStoreError

__all__ = [
    "CoordinatorAddress",
    "mac_of",
    "CoordinatorReadError",
    "key_id",
    "signed_request",
    "signed_reply",
    "reply_of",
    "parse_frame",
    "frame",
    "LENGTH",
    "NONCE_BYTES",
    "MAX_REQUEST_BYTES",
    "ANSWER_TIMEOUT_S",
]


#: The largest request: a token, a few numbers and a task's metrics record.
MAX_REQUEST_BYTES = 64 * 1024
#: How long an ask may wait for the durable records (P ranged reads on the driver).
ANSWER_TIMEOUT_S = 120.0
NONCE_BYTES = 16
LENGTH = struct.Struct(">I")


class CoordinatorReadError(SessionStoreError, OSError):
    """The coordinator could not read the durable event-time records (its message is
    the driver's error: the retry policy tells a transient one from a permanent
    one)."""


@dataclass(frozen=True)
class CoordinatorAddress:
    """Where a task reaches its operator's coordinator, and the operator's token
    (travels to the tasks pickled with them)."""

    host: str
    port: int
    token: str

    def __repr__(self) -> str:  # the token is a secret: never logged
        return f"CoordinatorAddress({self.host!r}, {self.port})"


def frame(message: Any) -> bytes:
    body = msgpack.packb(message, use_bin_type=True)
    return LENGTH.pack(len(body)) + body


@functools.lru_cache(maxsize=256)
def key_id(token: str) -> str:
    """The public name of ``token``'s key on the wire (see the module doc)."""
    return hashlib.sha256(token.encode()).hexdigest()[:16]


@functools.lru_cache(maxsize=256)
def _keyed(token: str) -> Any:
    """An HMAC-SHA256 keyed by ``token`` with nothing fed yet (copied per message:
    the key's padding is hashed once, not per request)."""
    return hmac.new(token.encode(), digestmod=hashlib.sha256)


def mac_of(token: str, *parts: bytes) -> bytes:
    mac = _keyed(token).copy()
    for part in parts:
        mac.update(part)
    return mac.digest()


def signed_request(token: str, message: dict[str, Any]) -> tuple[bytes, bytes]:
    """``(frame, nonce)``: ``message`` as a signed request (see the module doc)."""
    nonce = os.urandom(NONCE_BYTES)
    body = msgpack.packb(
        {**message, "ts": int(time.time() * 1000), "nonce": nonce}, use_bin_type=True
    )
    return frame([key_id(token), body, mac_of(token, body)]), nonce


def signed_reply(token: str, nonce: bytes, message: dict[str, Any]) -> bytes:
    body = msgpack.packb(message, use_bin_type=True)
    return frame([body, mac_of(token, b"reply", nonce, body)])


def reply_of(token: str, nonce: bytes, data: bytes) -> dict[str, Any] | None:
    """The reply in ``data`` (a whole frame) if the coordinator holding ``token``
    signed it for the request ``nonce``; None otherwise."""
    try:
        body, mac = msgpack.unpackb(data[LENGTH.size :], raw=False)
        if not hmac.compare_digest(mac_of(token, b"reply", nonce, body), mac):
            return None
        reply = msgpack.unpackb(body, raw=False)
    except Exception:
        return None
    return reply if isinstance(reply, dict) else None


def parse_frame(buffer: bytearray) -> Any:
    """A whole request from ``buffer`` (None until it has arrived): the decoded
    msgpack value, checked by the coordinator; ``ValueError`` for bytes that are
    not one."""
    if len(buffer) < LENGTH.size:
        return None
    (length,) = LENGTH.unpack_from(buffer)
    if length > MAX_REQUEST_BYTES - LENGTH.size:
        raise ValueError(f"a request of {length} bytes")
    if len(buffer) < LENGTH.size + length:
        return None
    if len(buffer) > LENGTH.size + length:
        raise ValueError("bytes after the request")
    try:
        request = msgpack.unpackb(bytes(buffer[LENGTH.size :]), raw=False)
    except Exception as exc:
        raise ValueError(f"not msgpack: {exc}") from None
    return request
