"""Larger-than-memory click logs: a :class:`~hybridrank.data.sources.ClickLogSource` read in chunks.

There is one data path (docs/ARCHITECTURE.md): :class:`StreamingClickLogSource` is the click-log
source with ``chunk_rows`` set (its defaults: 100,000 impressions per chunk, a hash split), read
through :class:`~hybridrank.data.scanner.ClickLogScanner` (the chunker exports use too). The split,
the schema fit, the transform, the batches (:class:`~hybridrank.data.stream.BatchStream`) and the
data module (:class:`~hybridrank.data.datamodule.ListDataModule`) are those of every source; an
in-memory source is the same path with one chunk, so a log that fits in one chunk trains exactly
as ``data=clicklog`` does.

What chunking changes: one chunk is in memory at a time; the order of chunks is a permutation
seeded by ``(seed, epoch)`` and the pooling units inside a chunk are shuffled by the sampler;
pooling scopes (``session``, ``user``) pool requests **within a chunk** (a session cut by a chunk
boundary forms two rank lists); the split must be by hash (a time split needs every key's start
time before the first chunk). Sharding over DDP ranks and loader workers:
:class:`~hybridrank.data.stream.BatchStream`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from hybridrank.data.readers import ColumnMap
from hybridrank.data.sources import ClickLogSource

__all__ = ["StreamingClickLogSource", "STREAM_SPLIT"]

#: Defaults of a streamed log's split keys (a key missing from ``split`` takes these).
STREAM_SPLIT = {"by": "hash", "val": 0.1, "test": 0.2, "key": "request", "seed": 0}


class StreamingClickLogSource(ClickLogSource):
    """A parquet / CSV click log read in chunks of whole requests (module docstring).

    :class:`~hybridrank.data.sources.ClickLogSource` with streaming defaults: ``chunk_rows``
    100,000, and ``split`` keys defaulting to ``{"by": "hash", "val": 0.1, "test": 0.2, "key":
    "request", "seed": 0}``; ``split=None`` makes every row training data. Every other argument
    (value and vocabulary policies, ``fit_rows``, ``normalize``, ``schema``) is the click-log
    source's. Each request's rows must be adjacent in the files (a request may continue into the
    next file); a scattered log is refused naming the request and rows.
    """

    def __init__(self, path: str | Path | Sequence[str | Path], columns: ColumnMap | Mapping, *,
                 split: Mapping | None = None, chunk_rows: int = 100_000, **kwargs):
        spec = None if split is None else {**STREAM_SPLIT, **dict(split)}
        super().__init__(path, columns, split=spec or STREAM_SPLIT, chunk_rows=chunk_rows, **kwargs)
        self.split = spec
