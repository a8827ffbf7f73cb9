"""Data: sources, schemas and vocabularies, readers (click logs, LibSVM), the streaming scanner,
the group-aware sampler, the DataModules and the simulators. Imports only :mod:`hybridrank.lists`
(and :mod:`hybridrank.atomic`) from the rest of the package.

- ``schema.py``: :class:`Schema` (features, vocabularies, scaler, value policies), ``SchemaFit``.
- ``source.py``: the ``Source`` interface; ``sources.py``: the sources, one data path in memory
  (one chunk) or streamed (``streaming.py``: ``StreamingClickLogSource``, many chunks);
  ``splits.py``: the one split rule (``split_frame``) of both.
- ``readers.py`` (click logs, ``ColumnMap``), ``validate.py`` (``validate_frame``), ``libsvm.py`` (LETOR files),
  ``scanner.py`` (files in chunks of whole requests), ``vocab.py``, ``hashing.py``,
  ``fingerprint.py`` (what a model was trained on).
- ``sampler.py`` (whole-request batches of one ``ListData``, pooling scopes, DDP shards),
  ``stream.py`` (``BatchStream``: a source's chunks through the sampler, above both; what it reads
  of a source is ``chunked.ChunkedSource``), ``datamodule.py``.
- ``simulators/``: the built-in click-log simulator and the randomly built click-log worlds with a
  known truth (for judging defaults across many logs); ``simulate.py`` and ``worlds.py``
  re-export them.
"""

from hybridrank._lazy import lazy_exports

_EXPORTS = {
    "Schema": "hybridrank.data.schema", "POLICY_DEFAULTS": "hybridrank.data.schema",
    "SchemaFit": "hybridrank.data.schema", "Source": "hybridrank.data.sources",
    "Splits": "hybridrank.data.sources", "SimulatedSource": "hybridrank.data.sources",
    "LetorSource": "hybridrank.data.sources", "ClickLogSource": "hybridrank.data.sources",
    "SIM_COLUMNS_MAP": "hybridrank.data.sources",
    "split_frame": "hybridrank.data.splits", "SPLITS": "hybridrank.data.splits",
    "stable_hash": "hybridrank.data.hashing",
    "ColumnMap": "hybridrank.data.readers", "read_clicklog": "hybridrank.data.readers",
    "validate_frame": "hybridrank.data.validate", "scan_clicklog": "hybridrank.data.readers",
    "read_libsvm": "hybridrank.data.libsvm",
    "VocabPolicy": "hybridrank.data.vocab", "vocab_policies": "hybridrank.data.vocab",
    "ClickLogScanner": "hybridrank.data.scanner",
    "GroupBatchSampler": "hybridrank.data.sampler", "ListDataset": "hybridrank.data.collate",
    "collate": "hybridrank.data.collate", "unit_ids": "hybridrank.data.sampler",
    "POOLING_SCOPES": "hybridrank.data.sampler",
    "BatchStream": "hybridrank.data.stream", "ChunkedSource": "hybridrank.data.chunked",
    "check_fingerprint": "hybridrank.data.fingerprint",
    "ListDataModule": "hybridrank.data.datamodule",
    "StreamingClickLogSource": "hybridrank.data.streaming",
    "simulate_clicklog": "hybridrank.data.simulate",
    "WorldSpec": "hybridrank.data.worlds", "World": "hybridrank.data.worlds",
    "draw_world": "hybridrank.data.worlds", "simulate_world": "hybridrank.data.worlds",
    "load_world": "hybridrank.data.worlds",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
