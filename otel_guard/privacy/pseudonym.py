"""Keyed pseudonyms for tool names in exported spans.

A pseudonym is ``tool_`` followed by the first 16 hex digits (64 bits) of HMAC-SHA256 of the
UTF-8 name under a key. Equal names under one key give equal pseudonyms and different names give
different ones (a collision needs about 2**32 distinct names), so a replay of redacted traces
makes the guard's decisions unchanged: the reducer only ever compares tool names. Without the key
a pseudonym cannot be turned back into a name, not even by trying a dictionary of likely names.

The key comes from the ``key`` argument, else from the environment variable
:data:`PSEUDONYM_KEY_ENV` (its UTF-8 bytes), else it is a random key made once per process:

* a **deployment key** (argument or environment, shared by every process of the deployment)
  gives a tool the same pseudonym in every process and after restarts, so traces of a fleet can
  be counted per tool; whoever holds the key can test guessed names, so keep it secret and rotate
  it to unlink old traces from new ones;
* the **per-process key** gives pseudonyms that hold within one process only: a prompt's traces
  still replay exactly (a prompt never spans processes), but nothing correlates across processes
  or restarts, and once the process exits nobody can link a pseudonym to a name.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import threading
from typing import Final

__all__ = ["PSEUDONYM_HEX_DIGITS", "PSEUDONYM_KEY_ENV", "PSEUDONYM_PREFIX", "Pseudonymizer"]

PSEUDONYM_KEY_ENV: Final = "OTEL_GUARD_PSEUDONYM_KEY"
"""The environment variable holding the deployment's pseudonym key."""

PSEUDONYM_PREFIX: Final = "tool_"
"""Marks a value as a pseudonym; with the hex digits it is a valid, non-blank tool name."""

PSEUDONYM_HEX_DIGITS: Final = 16
"""64 bits: collisions are negligible for any real tool catalogue, and names stay short."""

_CACHE_LIMIT: Final = 4096
_process_key: bytes | None = None
_process_key_lock = threading.Lock()


def _random_process_key() -> bytes:
    global _process_key
    with _process_key_lock:
        if _process_key is None:
            _process_key = secrets.token_bytes(32)
        return _process_key


def _key_bytes(key: str) -> bytes:
    """The bytes of a text key. A value the process received as bytes that are not UTF-8 (an
    environment variable) reaches Python with those bytes escaped as lone surrogates: they are
    turned back into exactly the bytes the operator set, so every process of a deployment, and
    the Collector, key with the same bytes. Any other lone surrogate is kept as its code point's
    UTF-8 form, so an odd key is still a key, never an error at export."""
    try:
        return key.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return key.encode("utf-8", "surrogatepass")


class Pseudonymizer:
    """Turns names into keyed pseudonyms; the key is fixed at construction.

    ``key`` (bytes, or text taken as UTF-8) wins; else :data:`PSEUDONYM_KEY_ENV` when set and not
    empty (bytes that are not UTF-8 are used as set); else the process's random key, shared by
    every pseudonymizer of the process. A ``key`` of another type raises ``TypeError`` here,
    when the host starts, rather than failing every export.
    """

    __slots__ = ("_cache", "_key", "from_deployment")

    def __init__(self, key: bytes | str | None = None) -> None:
        if key is None:
            key = os.environ.get(PSEUDONYM_KEY_ENV) or None
        if isinstance(key, (bytearray, memoryview)):
            key = bytes(key)
        if isinstance(key, str):
            key = _key_bytes(key)
        elif key is not None and not isinstance(key, bytes):
            raise TypeError(f"pseudonym_key must be bytes or str, not {type(key).__name__}")
        self.from_deployment = bool(key)
        """True when the key came from the argument or the environment, not chance."""
        self._key = key if key else _random_process_key()
        self._cache: dict[str, str] = {}

    def __call__(self, name: str, prefix: str = PSEUDONYM_PREFIX) -> str:
        """The pseudonym of ``name``: ``prefix`` and 16 hex digits of its HMAC-SHA256."""
        digits = self._cache.get(name)
        if digits is None:
            digest = hmac.new(self._key, name.encode("utf-8", "surrogatepass"), hashlib.sha256)
            digits = digest.hexdigest()[:PSEUDONYM_HEX_DIGITS]
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache.clear()  # tool names are few; this only bounds a flood
            self._cache[name] = digits
        return prefix + digits
