"""The device timing script, as far as a machine without a GPU can run it."""

from __future__ import annotations

import pytest
import torch

from paged_backend_cuda import bench


def test_without_a_gpu_it_says_so_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    if torch.cuda.is_available():  # pragma: no cover - a GPU machine runs the real thing
        pytest.skip("a GPU is visible")
    assert bench.main(["--batches", "1", "--contexts", "16"]) == 2
    assert "no CUDA GPU" in capsys.readouterr().err


def test_the_metadata_it_times_is_a_valid_decode_batch() -> None:
    """Shuffled tables that cover each row's context, slot -1 (nothing written), host copies for planners."""
    md, num_blocks = bench._metadata(3, 40, 16, torch.device("cpu"))
    assert md.block_table.shape == (3, 3) and num_blocks == 10
    used = md.block_table.flatten().tolist()
    assert sorted(used) == list(range(1, 10))  # every block once, the null block 0 never
    assert md.num_decodes == 3 and md.max_query_len == 1 and bool((md.slot_mapping == -1).all())
    assert md.seq_lens_cpu is not None and md.seq_lens_cpu.tolist() == [40, 40, 40]
