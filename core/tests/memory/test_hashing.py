"""Chained block hashes."""

import pytest

from paged_core.errors import ConfigError
from paged_core.memory.hashing import ROOT_HASH, make_block_hash_fn


def test_hash_depends_on_parent_tokens_and_extra_keys() -> None:
    h = make_block_hash_fn()
    base = h(ROOT_HASH, [1, 2, 3], ())
    assert base == h(ROOT_HASH, [1, 2, 3], ())
    assert len(base) == 32  # sha256 by default
    assert base != h(ROOT_HASH, [1, 2, 4], ())
    assert base != h(b"\x01" * 32, [1, 2, 3], ())
    assert base != h(ROOT_HASH, [1, 2, 3], (("salt", "t1"),))
    assert h(ROOT_HASH, [1, 2, 3], (("salt", "t1"),)) != h(ROOT_HASH, [1, 2, 3], (("salt", "t2"),))


def test_algorithm_is_configurable() -> None:
    assert len(make_block_hash_fn("sha512")(ROOT_HASH, [1], ())) == 64
    assert len(make_block_hash_fn("blake2b")(ROOT_HASH, [1], ())) == 64


def test_unknown_algorithm_names_allowed_ones() -> None:
    with pytest.raises(ConfigError, match="sha256"):
        make_block_hash_fn("crc32")


def test_large_token_ids_do_not_collide() -> None:
    h = make_block_hash_fn()
    assert h(ROOT_HASH, [2**40], ()) != h(ROOT_HASH, [0], ())
