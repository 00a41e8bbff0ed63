"""GPU memory accounting: what the paged pools hold, how much of it is waste, and how big to make them; and what a
runner's thread did (``RunnerLoad``), published beside its pools.

- ``MemoryReport`` (pure, from the pools' stats): per pool (``self``: decoder self-attention, ``cross``: encoder
  outputs as cross-attention entries) blocks used and free, internal fragmentation (allocated slots that hold no
  token), and bytes; the encoder cache's bytes (cross-attention entries kept for re-decodes of the same window).
- ``pool_blocks`` (pure): how many blocks each pool gets from a byte budget; ``budget_bytes`` reads the GPU's
  free memory at start (``torch.cuda.mem_get_info``) times ``models.gpu_memory_fraction``, capped at this process's
  share of the total (``models.gpu_memory_share``, ``share_budget``).
- ``MemoryCollector``: a Prometheus collector over named sources (a GpuRunner's ``memory``), read at scrape time:
  ``linguafusion_gpu_pool_blocks{model,pool,state=used|free}``, ``linguafusion_gpu_pool_fragmentation{model,pool}``,
  ``linguafusion_gpu_pool_bytes{model,pool}``, ``linguafusion_gpu_encoder_cache_bytes{model}``,
  ``linguafusion_gpu_encoder_cache_entries{model}``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields

from prometheus_client.core import GaugeMetricFamily, Metric

from .blocks import PoolStats


@dataclass
class RunnerLoad:
    """What a runner's thread did since it started: its batches of new work (encoded, then joined to the running
    batch) and its decode steps, with the rows they carried and the thread's wall time in each (a step waits for
    its tokens, so its time is the GPU's; a start's is mostly launching the encoder). On /metrics as
    ``linguafusion_gpu_runner_*_total{model}`` (observability.py ``GpuLoad``): a row's steps, mean rows per step
    and the share of its wall time the thread was busy say whether that model's runner is where the limit is."""

    starts: int = 0
    started_items: int = 0
    start_s: float = 0.0
    encode_s: float = 0.0  # of start_s: the recipe's encoder call (log-mel, encoder, outputs), the rest the pools'
    steps: int = 0
    step_rows: int = 0
    step_s: float = 0.0

    def since(self, before: RunnerLoad) -> RunnerLoad:
        return RunnerLoad(*(getattr(self, f.name) - getattr(before, f.name) for f in fields(self)))


@dataclass(frozen=True)
class PoolMemory:
    blocks: int
    used: int
    free: int
    fragmentation: float  # 0..1 of the allocated slots
    bytes_per_block: int

    @property
    def bytes_total(self) -> int:
        return self.blocks * self.bytes_per_block

    @property
    def bytes_used(self) -> int:
        return self.used * self.bytes_per_block

    @classmethod
    def of(cls, stats: PoolStats, bytes_per_token: int) -> PoolMemory:
        return cls(stats.blocks, stats.used, stats.free, stats.fragmentation, bytes_per_token * stats.block_size)


@dataclass(frozen=True)
class MemoryReport:
    pools: dict[str, PoolMemory]  # "self", "cross"
    encoder_cache_entries: int  # encoder outputs kept for reuse (the runner's memo)

    @property
    def encoder_cache_bytes(self) -> int:
        """Bytes the cross-attention pool holds now (every live encoder output, reused or in use)."""
        return self.pools["cross"].bytes_used if "cross" in self.pools else 0


def pool_blocks(budget: int, self_token_bytes: int, cross_token_bytes: int, *, block_size: int,
                cross_block_size: int, cross_share: float = 0.5, max_self_blocks: int | None = None) -> tuple[int, int]:
    """(self blocks, cross blocks) that fit in ``budget`` bytes, ``cross_share`` of it for the cross pool; at most
    ``max_self_blocks`` self blocks (what the largest batch of the longest sequences can fill: more would never be
    written, and their memory is left to the CUDA graphs and activations). Raises ValueError when not even two
    blocks of each fit (one is the reserved scratch block)."""
    if not 0.0 < cross_share < 1.0:
        raise ValueError("cross_share must be between 0 and 1")
    self_blocks = int(budget * (1.0 - cross_share)) // (self_token_bytes * block_size)
    if max_self_blocks is not None:
        self_blocks = min(self_blocks, max_self_blocks)
    cross_blocks = int(budget * cross_share) // (cross_token_bytes * cross_block_size)
    if self_blocks < 2 or cross_blocks < 2:
        raise ValueError(f"{budget} bytes of GPU memory hold no usable KV pool")
    return self_blocks, cross_blocks


def budget_bytes(device: str, fraction: float, share: float = 1.0) -> int:
    """``fraction`` of the memory free on ``device`` now (call it after the weights are loaded), at most ``share``
    of ``fraction`` of its total (``share_budget``)."""
    import torch

    free, total = torch.cuda.mem_get_info(torch.device(device))
    return share_budget(free, total, fraction, share)


def share_budget(free: int, total: int, fraction: float, share: float = 1.0) -> int:
    """The pools' bytes: ``fraction`` of what is free, and no more than ``share`` of ``fraction`` of the total, so
    M processes that start together (``serve --model-processes M``: share 1/M) split the memory evenly instead of
    the first taking most of it."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError("gpu_memory_fraction must be in (0, 1]")
    if not 0.0 < share <= 1.0:
        raise ValueError("gpu_memory_share must be in (0, 1]")
    return int(min(free * fraction, total * fraction * share))


class MemoryCollector:
    """Gauges of every watched runner's pools, computed when /metrics is read (nothing polls)."""

    def __init__(self) -> None:
        self._sources: dict[str, Callable[[], MemoryReport | None]] = {}

    def watch(self, model: str, source: Callable[[], MemoryReport | None]) -> None:
        self._sources[model] = source

    def collect(self) -> Iterator[Metric]:
        blocks = GaugeMetricFamily("linguafusion_gpu_pool_blocks", "Paged KV pool blocks by state",
                                   labels=["model", "pool", "state"])
        frag = GaugeMetricFamily("linguafusion_gpu_pool_fragmentation",
                                 "Share of allocated KV slots that hold no token (internal fragmentation)",
                                 labels=["model", "pool"])
        size = GaugeMetricFamily("linguafusion_gpu_pool_bytes", "Bytes of the paged KV pool", labels=["model", "pool"])
        cache = GaugeMetricFamily("linguafusion_gpu_encoder_cache_bytes",
                                  "Bytes of encoder outputs held as cross-attention entries", labels=["model"])
        entries = GaugeMetricFamily("linguafusion_gpu_encoder_cache_entries",
                                    "Encoder outputs kept for re-decodes of the same window", labels=["model"])
        for model, source in sorted(self._sources.items()):
            report = source()
            if report is None:
                continue
            for pool, mem in report.pools.items():
                blocks.add_metric([model, pool, "used"], mem.used)
                blocks.add_metric([model, pool, "free"], mem.free)
                frag.add_metric([model, pool], mem.fragmentation)
                size.add_metric([model, pool], mem.bytes_total)
            cache.add_metric([model], report.encoder_cache_bytes)
            entries.add_metric([model], report.encoder_cache_entries)
        yield from (blocks, frag, size, cache, entries)
