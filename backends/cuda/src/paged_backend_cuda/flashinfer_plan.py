"""One step's batch in FlashInfer's paged-KV form (CSR arrays instead of a block table), built into owned buffers.

FlashInfer's ``plan`` methods (``flashinfer/decode.py`` ``BatchDecodeWithPagedKVCacheWrapper.plan``,
``flashinfer/prefill.py`` ``BatchPrefillWithPagedKVCacheWrapper.plan``, 0.5.3 and 0.6.18) describe row ``b`` as
the pages ``kv_indices[kv_indptr[b]:kv_indptr[b + 1]]`` whose last one holds ``kv_last_page_len[b]`` tokens, and
(prefill only) its query tokens as ``[qo_indptr[b], qo_indptr[b + 1])``. From the contract: a row has
``ceil(seq_len / block_size)`` pages, the first entries of its block-table row, and ``seq_len % block_size`` (or a
full ``block_size``) tokens in the last one. Decode rows ``[0, num_decodes)`` go to the decode wrapper and the
prefill rows after them to the prefill wrapper, each with its own zero-based arrays.

Where each array lives follows what ``plan`` does with it: it copies ``indptr``, ``last_page_len`` and
``qo_indptr`` to the host (``.to("cpu")``) to schedule the work, so they are built on the host from the
metadata's host copies (pinned when the device is a GPU, so ``plan``'s copies to the device do not block); the
page ids are only read by the kernels, so they are gathered on the device from ``metadata.block_table`` with an
index computed on the host. The block table itself is never read on the host.

Graph padding (a ``UNIFORM_DECODE`` graph of ``n`` rows replaying ``live < n`` rows, whose host copies hold only
the live rows): padded rows get no pages (``kv_indptr`` repeats its last value) and ``kv_last_page_len = 1``.
FlashInfer's kernels read a row without pages as empty whatever its last-page length
(``include/flashinfer/page.cuh`` ``paged_kv_t::get_length``), and the decode scheduler still gives it one
work item (``include/flashinfer/attention/scheduler.cuh`` ``DecodeSplitKVIndptr``: ``max(pages, 1)``) whose
output is zero (``state_t::init``: ``o = 0``, ``d = 1``). The 1 only matters to the host planner, which
turns it into a 1-token row (``flashinfer/page.py`` ``get_seq_lens``), never into a 0-length one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from paged_core.api import AttentionMetadata, AttentionSpec, PagedError


@dataclass(frozen=True)
class FlashInferParams:
    """The per-layer scalars FlashInfer's ``plan`` takes, from one :class:`AttentionSpec`."""

    window_left: int
    """Keys ``[pos - window_left, pos]`` are visible; ``-1`` means no window."""
    logits_soft_cap: float | None
    """``None`` turns the soft cap off (FlashInfer reads it as 0)."""
    sm_scale: float


def attention_params(spec: AttentionSpec) -> FlashInferParams:
    """The spec's window of ``W`` keys (the query's own included) is FlashInfer's inclusive ``window_left = W - 1``."""
    window_left = spec.sliding_window - 1 if spec.sliding_window is not None else -1
    return FlashInferParams(window_left, spec.logits_soft_cap, spec.softmax_scale)


@dataclass(frozen=True)
class FlashInferStep:
    """One step's arrays; the tensors are views of :class:`FlashInferPlanner`'s buffers, valid until its next build.

    ``kv_indptr``, ``kv_last_page_len``, ``prefill_qo_indptr`` and ``prefill_kv_indptr`` are host (CPU)
    tensors; ``kv_indices`` is on the planner's device. Rows ``[num_live_rows, num_rows)`` are graph padding.
    """

    block_size: int
    table_width: int
    num_rows: int
    num_live_rows: int
    num_decodes: int
    num_prefills: int
    num_decode_pages: int
    prefill_token_start: int
    """Index of the first prefill token in the step's query (``query_start_loc[num_decodes]``)."""
    num_prefill_tokens: int
    kv_indptr: torch.Tensor
    """int32 ``[num_rows + 1]``, host: every row, decode rows first, zero-based."""
    kv_last_page_len: torch.Tensor
    """int32 ``[num_rows]``, host, each in ``[1, block_size]``."""
    kv_indices: torch.Tensor
    """int32 ``[total pages]``, device: the block ids of every row's pages, row after row."""
    prefill_qo_indptr: torch.Tensor
    """int32 ``[num_prefills + 1]``, host: the prefill rows' query tokens, relative to the first prefill token."""
    prefill_kv_indptr: torch.Tensor
    """int32 ``[num_prefills + 1]``, host: the prefill rows' pages, zero-based into :attr:`prefill_kv_indices`."""

    @property
    def decode_kv_indptr(self) -> torch.Tensor:
        """``kv_indptr`` of the decode rows (already zero-based: they come first)."""
        return self.kv_indptr[: self.num_decodes + 1]

    @property
    def decode_kv_indices(self) -> torch.Tensor:
        """The decode rows' pages."""
        return self.kv_indices[: self.num_decode_pages]

    @property
    def decode_kv_last_page_len(self) -> torch.Tensor:
        """``kv_last_page_len`` of the decode rows."""
        return self.kv_last_page_len[: self.num_decodes]

    @property
    def prefill_kv_indices(self) -> torch.Tensor:
        """The prefill rows' pages."""
        return self.kv_indices[self.num_decode_pages :]

    @property
    def prefill_kv_last_page_len(self) -> torch.Tensor:
        """``kv_last_page_len`` of the prefill rows."""
        return self.kv_last_page_len[self.num_decodes :]


class FlashInferPlanner:
    """Builds :class:`FlashInferStep` into buffers it owns, reused from step to step.

    Buffers start at ``max_rows`` rows and ``max_pages`` pages and double when a step needs more. Growing
    is safe because no consumer keeps a pointer across steps: FlashInfer's CUDA-graph wrappers copy the
    arrays into their own fixed buffers in ``plan``, and the other wrappers take new references each plan.
    """

    def __init__(self, device: torch.device | str, max_rows: int = 64, max_pages: int = 1024) -> None:
        self.device = torch.device(device)
        # Pinned host memory lets plan()'s host-to-device copies run without blocking (CUDA only).
        self._pin = self.device.type == "cuda"
        self._rows = 0
        self._pages = 0
        self._reserve(max(max_rows, 1), max(max_pages, 1))

    def build(self, metadata: AttentionMetadata) -> FlashInferStep:
        """Describe ``metadata``'s rows (called from ``prepare``: outside graphs, host work allowed)."""
        rows = int(metadata.seq_lens.shape[0])
        d, p = metadata.num_decodes, metadata.num_prefills
        if d + p != rows:
            raise PagedError(f"metadata has {rows} rows but num_decodes + num_prefills = {d} + {p}")
        qsl, seq = _host_copies(metadata)
        live = int(seq.shape[0])
        if live > rows or qsl.shape[0] != live + 1:
            raise PagedError(f"host copies ({qsl.shape[0]} query_start_loc, {live} seq_lens) do not fit {rows} rows")
        if live < rows and p:
            raise PagedError("host copies shorter than the rows (graph padding) are only valid for pure-decode steps")
        bs, width = metadata.block_size, int(metadata.block_table.shape[1])
        seq64 = seq.to(torch.int64)
        pages = (seq64 + bs - 1) // bs
        if live and int(pages.max()) > width:
            b = int(pages.argmax())
            raise PagedError(f"row {b}: seq_len {int(seq64[b])} needs {int(pages[b])} blocks, table has {width}")
        cum = torch.cumsum(pages, 0)
        total = int(cum[-1]) if live else 0
        self._reserve(rows, total)

        indptr = self._indptr[: rows + 1]
        indptr[0] = 0
        indptr[1 : live + 1] = cum
        indptr[live + 1 :] = total  # padding rows: no pages
        last = self._last[:rows]
        last[:live] = torch.where(pages > 0, seq64 - (pages - 1) * bs, 1)
        last[live:] = 1  # never 0: see the module docstring

        # Flat block-table positions of every page, row after row; the ids themselves are read on the device.
        starts = cum - pages
        row_of = torch.repeat_interleave(torch.arange(live), pages)
        index = self._index_host[:total]
        torch.sub(torch.arange(total), starts.repeat_interleave(pages), out=index)
        index.add_(row_of * width)
        device_index = self._index[:total]
        device_index.copy_(index, non_blocking=self._pin)
        indices = self._indices[:total]
        torch.index_select(metadata.block_table.reshape(-1), 0, device_index, out=indices)

        qo = self._qo[: p + 1]
        prefill_kv = self._prefill_kv[: p + 1]
        start = int(qsl[d]) if p else 0
        if p:
            qo.copy_(qsl[d:] - qsl[d])
            prefill_kv.copy_(indptr[d:] - indptr[d])
        else:
            qo.zero_()
            prefill_kv.zero_()
        return FlashInferStep(
            block_size=bs,
            table_width=width,
            num_rows=rows,
            num_live_rows=live,
            num_decodes=d,
            num_prefills=p,
            num_decode_pages=int(indptr[d]),
            prefill_token_start=start,
            num_prefill_tokens=int(qsl[live]) - start if p else 0,
            kv_indptr=indptr,
            kv_last_page_len=last,
            kv_indices=indices,
            prefill_qo_indptr=qo,
            prefill_kv_indptr=prefill_kv,
        )

    def _reserve(self, rows: int, pages: int) -> None:
        """Make room for ``rows`` rows and ``pages`` pages, doubling a buffer that is too small."""
        if rows > self._rows:
            self._rows = max(rows, 2 * self._rows)
            self._indptr = self._host(self._rows + 1, torch.int32)
            self._last = self._host(self._rows, torch.int32)
            self._qo = self._host(self._rows + 1, torch.int32)
            self._prefill_kv = self._host(self._rows + 1, torch.int32)
        if pages > self._pages:
            self._pages = max(pages, 2 * self._pages)
            self._index_host = self._host(self._pages, torch.int64)
            self._index = torch.zeros(self._pages, dtype=torch.int64, device=self.device)
            self._indices = torch.zeros(self._pages, dtype=torch.int32, device=self.device)

    def _host(self, size: int, dtype: torch.dtype) -> torch.Tensor:
        return torch.zeros(size, dtype=dtype, pin_memory=self._pin)


def _host_copies(metadata: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
    """``query_start_loc`` and ``seq_lens`` on the host: the metadata's copies, else read back from the device.

    Reading back is allowed here because this runs in ``prepare``, outside any graph; the graph runner leaves
    the copies unset only when it prepares a capture.
    """
    qsl = metadata.query_start_loc_cpu
    seq = metadata.seq_lens_cpu
    if qsl is None or seq is None:
        qsl, seq = metadata.query_start_loc.cpu(), metadata.seq_lens.cpu()
    return qsl.to(torch.int64), seq
