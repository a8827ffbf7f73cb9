"""What the batch builder reads from a source: its chunks of whole requests, one split at a time.

:class:`ChunkedSource` is the whole of what :class:`~hybridrank.data.stream.BatchStream` needs,
so batching knows nothing else of sources, and sources know nothing of batching. Every
:class:`~hybridrank.data.source.Source` satisfies it; so does any object with these three
members (a check: ``tests/test_sampler.py`` batches such an object).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from hybridrank.data.scanner import Chunk
    from hybridrank.data.schema import Schema
    from hybridrank.lists import ListData

__all__ = ["ChunkedSource"]


class ChunkedSource(Protocol):
    """Data as chunks of whole requests, each read as ``ListData`` for one split.

    A chunk is a :class:`~hybridrank.data.scanner.Chunk`: the batch builder reads its ``index``
    (the sampler seed of its batches), ``n_rows`` (impressions, for equal shards under DDP) and
    ``base`` (impressions before it: ``Batch.rows`` are global row numbers).
    """

    @property
    def schema(self) -> Schema:
        """The schema the chunks are read with (asked once up front: a fit's errors surface
        before the first batch)."""
        ...

    def layout(self) -> list[Chunk]:
        """The chunks, in storage order (one for data held in memory)."""
        ...

    def read_chunk(self, chunk: Chunk, split: str) -> ListData | None:
        """The ``split`` (``"train"``, ``"val"``, ``"test"``) requests of ``chunk``; None when it
        has none."""
        ...
