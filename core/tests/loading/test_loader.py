"""Finding models: clear errors for unknown paths and damaged GGUF files."""

from __future__ import annotations

from pathlib import Path

import pytest

from paged_core.errors import ConfigError
from paged_core.loading.loader import check_gguf, embedded_model_path, resolve_source


def test_unknown_path_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    with pytest.raises(ConfigError, match=r"no-such-model.*not found"):
        resolve_source(str(missing))


def test_directory_without_config_or_gguf(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"no config\.json and no \.gguf file"):
        resolve_source(str(tmp_path))


def test_file_that_is_not_gguf(tmp_path: Path) -> None:
    f = tmp_path / "weights.bin"
    f.write_bytes(b"\0" * 16)
    with pytest.raises(ConfigError, match=r"not a \.gguf file"):
        resolve_source(str(f))


def test_embedded_model_is_found() -> None:
    path = embedded_model_path()
    src = resolve_source(None)
    assert path.is_file() and src.gguf_file == path.name and src.directory == path.parent


def test_wrong_magic(tmp_path: Path) -> None:
    f = tmp_path / "fake.gguf"
    f.write_bytes(b"NOPE" + b"\0" * 64)
    with pytest.raises(ConfigError, match=r"fake\.gguf: not a GGUF file"):
        check_gguf(f)


@pytest.mark.parametrize("keep", [0.5, 0.999])
def test_truncated_gguf(tmp_path: Path, keep: float) -> None:
    data = embedded_model_path().read_bytes()
    f = tmp_path / "cut.gguf"
    f.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(ConfigError, match=r"cut\.gguf: corrupt or truncated GGUF file"):
        check_gguf(f)


def test_corrupt_header(tmp_path: Path) -> None:
    data = bytearray(embedded_model_path().read_bytes()[:4096])
    data[8:24] = b"\xff" * 16  # tensor and metadata counts become absurd
    f = tmp_path / "bad.gguf"
    f.write_bytes(bytes(data))
    with pytest.raises(ConfigError, match=r"bad\.gguf: corrupt or truncated GGUF file"):
        check_gguf(f)


def test_intact_gguf_passes() -> None:
    check_gguf(embedded_model_path())
