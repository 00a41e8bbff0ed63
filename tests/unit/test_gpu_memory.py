"""GPU memory accounting on the CPU: pool blocks used / free, internal fragmentation, the encoder cache's bytes as
Prometheus gauges, and pools sized from the GPU's free memory."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from gpu_models import tiny_whisper_recipe

from lingua_fusion.observability import Metrics
from lingua_fusion.serving.gpu.blocks import BlockPool
from lingua_fusion.serving.gpu.memory import MemoryReport, PoolMemory, pool_blocks
from lingua_fusion.serving.gpu.paged import PagedKV
from lingua_fusion.serving.gpu.runner import GpuRunner
from lingua_fusion.serving.ports import AsrInput


def _value(text: str, series: str) -> float:
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{series} not in /metrics")


def test_a_pool_reports_blocks_fragmentation_and_bytes() -> None:
    pool = BlockPool(10, 4, reserved=1)
    assert pool.allocate(1, 5) and pool.allocate(2, 8)  # 2 + 2 blocks; 13 tokens in 16 slots
    mem = PoolMemory.of(pool.stats(), bytes_per_token=100)
    assert (mem.blocks, mem.used, mem.free) == (9, 4, 5)
    assert mem.fragmentation == pytest.approx(3 / 16)
    assert mem.bytes_used == 4 * 4 * 100 and mem.bytes_total == 9 * 4 * 100
    pool.free(1)
    pool.free(2)
    empty = PoolMemory.of(pool.stats(), 100)
    assert (empty.used, empty.free, empty.fragmentation) == (0, 9, 0.0)


def test_pools_are_sized_from_a_byte_budget() -> None:
    blocks, cross = pool_blocks(1_000_000, 100, 50, block_size=10, cross_block_size=20, cross_share=0.25)
    assert (blocks, cross) == (750, 250)  # 750 * 10 * 100 + 250 * 20 * 50 bytes = the budget
    assert blocks * 10 * 100 + cross * 20 * 50 <= 1_000_000
    with pytest.raises(ValueError):
        pool_blocks(1000, 100, 100, block_size=16, cross_block_size=64)  # not one usable block
    # no more self blocks than the largest batch of the longest sequences fills; the bytes left over stay free
    # (for the CUDA graphs and activations: taken by the pool, a process of several runners ran out of memory)
    capped = pool_blocks(1_000_000, 100, 50, block_size=10, cross_block_size=20, cross_share=0.25, max_self_blocks=300)
    assert capped == (300, 250)


def test_the_runner_publishes_its_pools_and_encoder_cache_as_gauges(monkeypatch: pytest.MonkeyPatch) -> None:
    recipe = tiny_whisper_recipe()
    d = recipe.decoder
    token_bytes = PagedKV.bytes_per_token(d.n_layer, d.n_head, d.head_dim, torch.float32)
    budget = 512 * 8 * token_bytes  # the pools' share of "free GPU memory": 256 self blocks, 128 cross blocks
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda _device=None: (budget * 2, budget * 4))
    runner = GpuRunner.sized(recipe, fraction=0.5, device="cpu", block_size=8, cross_block_size=16,
                             dtype=torch.float32, memo=4)
    metrics = Metrics()  # the server's /metrics
    metrics.gpu_memory.watch("asr:test", lambda: runner.memory)
    runner.on_load = metrics.gpu_load.sink("asr:test")
    clip = AsrInput(np.random.default_rng(0).normal(0, 0.1, 16000 * 2).astype(np.float32))
    try:
        assert runner.engine.pool.num_blocks == 256 and runner.engine.cross_pool.num_blocks == 128
        runner.submit([clip], [True])[0].result(timeout=60)
        runner.submit([clip], [False])[0].result(timeout=60)  # the same window: its encoder output is reused
        for _ in range(200):  # the runner's thread publishes a report every 0.25 s while busy, 0.5 s while idle
            report = runner.memory
            told = 'linguafusion_gpu_runner_started_items_total{model="asr:test"} 2.0' in metrics.render().decode()
            if report is not None and report.encoder_cache_entries == 1 and report.pools["self"].used == 0 and told:
                break
            time.sleep(0.05)
    finally:
        runner.close()
    assert isinstance(report, MemoryReport)
    assert report.pools["self"].used == 0  # every decode gave its blocks back
    cross = report.pools["cross"]
    assert report.encoder_cache_entries == 1 and cross.used >= 1  # one window kept for re-decodes
    assert report.encoder_cache_bytes == cross.used * 16 * token_bytes
    text = metrics.render().decode()
    assert _value(text, 'linguafusion_gpu_pool_blocks{model="asr:test",pool="cross",state="used"}') == cross.used
    assert _value(text, 'linguafusion_gpu_pool_blocks{model="asr:test",pool="self",state="free"}') == 255
    assert _value(text, 'linguafusion_gpu_encoder_cache_bytes{model="asr:test"}') == report.encoder_cache_bytes
    assert 0.0 <= _value(text, 'linguafusion_gpu_pool_fragmentation{model="asr:test",pool="cross"}') < 1.0
    # what the runner's thread did, as counters: what it was told last, to the item
    load = runner.load
    assert _value(text, 'linguafusion_gpu_runner_started_items_total{model="asr:test"}') == load.started_items == 2
    assert _value(text, 'linguafusion_gpu_runner_steps_total{model="asr:test"}') == load.steps > 0
    assert _value(text, 'linguafusion_gpu_runner_step_rows_total{model="asr:test"}') == load.step_rows >= load.steps
    assert _value(text, 'linguafusion_gpu_runner_busy_seconds_total{model="asr:test",phase="step"}') == \
        pytest.approx(load.step_s)
    # its encoder batches: two (the second window came from the memo, so no encoder time in that one)
    assert _value(text, 'linguafusion_gpu_runner_starts_total{model="asr:test"}') == load.starts == 2
    encode_s = _value(text, 'linguafusion_gpu_runner_encode_seconds_total{model="asr:test"}')
    assert encode_s == pytest.approx(load.encode_s) and 0 < load.encode_s <= load.start_s
