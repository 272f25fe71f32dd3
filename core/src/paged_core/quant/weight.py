"""QuantizedWeight: one linear layer's weight kept in its packed format, with the exact dequantization."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from paged_core.errors import WeightFormatError
from paged_core.quant.formats import INT8, WeightFormat


@dataclass(frozen=True, eq=False)
class QuantizedWeight:
    """A ``[out_features, in_features]`` weight in a packed :class:`WeightFormat`.

    ``data`` holds the packed rows: ``uint8`` ``[out_features, format.row_bytes(in_features)]``
    for the GGUF block formats (a GGUF file's bytes, unchanged), ``int8``
    ``[out_features, in_features]`` for ``int8``, whose per-row fp32 ``scale``
    ``[out_features]`` is kept apart (``None`` for every other format). Rows are
    independent, so :meth:`rows` slices them as views and :meth:`cat` and
    :meth:`select_rows` rearrange them without changing any value.
    Construction checks every size and names ``name`` in its error.
    """

    format: WeightFormat
    shape: tuple[int, int]
    data: torch.Tensor
    scale: torch.Tensor | None = None
    name: str = "weight"
    """What the weight is called in the checkpoint (for errors and logs)."""

    def __post_init__(self) -> None:
        n, k = self.shape
        fmt = self.format
        problems = []
        if n < 1 or k < 1:
            problems.append(f"shape {self.shape} is empty")
        elif k % fmt.block_size:
            problems.append(f"in_features {k} is not a multiple of the {fmt.name} block of {fmt.block_size}")
        want_dtype = torch.int8 if fmt is INT8 else torch.uint8
        if self.data.dtype != want_dtype:
            problems.append(f"data is {self.data.dtype}, {fmt.name} needs {want_dtype}")
        if not problems:
            want = (n, fmt.row_bytes(k))
            if tuple(self.data.shape) != want:
                have = self.data.numel() * self.data.element_size()
                problems.append(
                    f"data is {tuple(self.data.shape)} ({have} bytes), {fmt.name} {self.shape} needs "
                    f"{want} ({want[0] * want[1]} bytes: {k // fmt.block_size} blocks of "
                    f"{fmt.block_bytes} bytes per row)"
                )
            elif self.data.stride(-1) != 1:
                problems.append("data rows are not contiguous")
        if fmt is INT8:
            if self.scale is None or tuple(self.scale.shape) != (n,) or self.scale.dtype != torch.float32:
                got = None if self.scale is None else (tuple(self.scale.shape), self.scale.dtype)
                problems.append(f"int8 needs an fp32 scale of shape ({n},), got {got}")
        elif self.scale is not None:
            problems.append(f"{fmt.name} keeps its scales inside the blocks; scale must be None")
        if problems:
            raise WeightFormatError(f"{self.name}: " + "; ".join(problems))

    @property
    def out_features(self) -> int:
        return self.shape[0]

    @property
    def in_features(self) -> int:
        return self.shape[1]

    @property
    def device(self) -> torch.device:
        return self.data.device

    @property
    def nbytes(self) -> int:
        """Bytes of the packed weight (data and scales)."""
        scale = self.scale.numel() * 4 if self.scale is not None else 0
        return self.data.numel() * self.data.element_size() + scale

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The exact weight ``[out_features, in_features]`` (computed in fp32, then cast to ``dtype``)."""
        from paged_core.quant.dequant import dequantize

        return dequantize(self).to(dtype)

    def rows(self, start: int, end: int) -> QuantizedWeight:
        """Output rows ``[start, end)`` as a view of the same bytes."""
        scale = self.scale[start:end] if self.scale is not None else None
        return QuantizedWeight(self.format, (end - start, self.in_features), self.data[start:end], scale, self.name)

    def select_rows(self, index: torch.Tensor) -> QuantizedWeight:
        """The rows at ``index`` (a permutation or selection of output features), copied."""
        scale = self.scale.index_select(0, index) if self.scale is not None else None
        data = self.data.index_select(0, index)
        return QuantizedWeight(self.format, (int(index.numel()), self.in_features), data, scale, self.name)

    def to(self, device: torch.device | str) -> QuantizedWeight:
        """The same weight on ``device``."""
        scale = self.scale.to(device) if self.scale is not None else None
        return QuantizedWeight(self.format, self.shape, self.data.to(device), scale, self.name)

    @staticmethod
    def cat(weights: Sequence[QuantizedWeight], name: str | None = None) -> QuantizedWeight:
        """Stack weights of one format and input size along the output features (a merged projection)."""
        first = weights[0]
        for w in weights[1:]:
            if w.format != first.format or w.in_features != first.in_features:
                raise WeightFormatError(
                    f"cannot merge {w.name} ({w.format.name}, in {w.in_features}) with "
                    f"{first.name} ({first.format.name}, in {first.in_features})"
                )
        data = cat_rows([w.data for w in weights])
        scale = cat_rows([w.scale for w in weights if w.scale is not None]) if first.scale is not None else None
        n = sum(w.out_features for w in weights)
        return QuantizedWeight(first.format, (n, first.in_features), data, scale, name or first.name)


def cat_rows(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """``torch.cat`` along dim 0, or a view when the tensors already are consecutive rows of one buffer.

    Merging projections a second time (another engine configuration over the same
    loaded model) then costs nothing and the modules keep sharing one copy of the bytes.
    """
    first = tensors[0]
    offset = first.storage_offset()
    for t in tensors:
        same_layout = (
            t.dim() >= 1
            and t.shape[1:] == first.shape[1:]
            and t.stride() == first.stride()
            and t.dtype == first.dtype
            and t.device == first.device
        )
        if not same_layout or t.untyped_storage().data_ptr() != first.untyped_storage().data_ptr():
            return torch.cat(list(tensors))
        if t.storage_offset() != offset:
            return torch.cat(list(tensors))
        offset += t.shape[0] * t.stride(0)
    rows = sum(t.shape[0] for t in tensors)
    return first.as_strided((rows, *first.shape[1:]), first.stride(), first.storage_offset())
