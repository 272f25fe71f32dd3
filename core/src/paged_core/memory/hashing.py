"""Chained block hashes for the prefix cache.

A full block's hash is ``H(parent_hash, token_ids, extra_keys)``; the chain
makes a block's identity depend on every token before it. Matching trusts
the digest, so the default is a cryptographic hash (sha256).
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Callable, Sequence
from typing import Any

from paged_core.errors import ConfigError

ExtraKeys = tuple[Any, ...]
BlockHashFn = Callable[[bytes, Sequence[int], ExtraKeys], bytes]


def make_block_hash_fn(algorithm: str = "sha256") -> BlockHashFn:
    """Return ``fn(parent, token_ids, extra_keys) -> digest`` using a hashlib algorithm."""
    if algorithm not in hashlib.algorithms_guaranteed or algorithm.startswith("shake"):
        allowed = sorted(a for a in hashlib.algorithms_guaranteed if not a.startswith("shake"))
        raise ConfigError(f"hash_algorithm {algorithm!r} is not supported (allowed: {', '.join(allowed)})")
    ctor = getattr(hashlib, algorithm)

    def block_hash(parent: bytes, token_ids: Sequence[int], extra_keys: ExtraKeys) -> bytes:
        h = ctor(parent)
        # Token ids as fixed-width integers: unambiguous and fast to serialize.
        h.update(array("q", token_ids).tobytes())
        if extra_keys:
            # repr of str/int/bytes tuples is canonical; the separator keeps it apart from token bytes.
            h.update(b"\x00extra:" + repr(extra_keys).encode())
        digest: bytes = h.digest()
        return digest

    return block_hash


ROOT_HASH: bytes = hashlib.sha256(b"paged-core prefix cache root").digest()
"""The parent of every first block."""
