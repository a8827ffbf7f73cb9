"""Evaluation: a model's (or score files') figures on a split, written once, and their tables.

The layer between ``serving`` and ``cli``: every report of the console scripts (``hybridrank-train``'s
result table and ``metrics.json``, ``hybridrank-eval``, ``hybridrank-compare``) and the benchmarks
get their figures here.

- ``figures.py``: gather a model's scores on a split (:func:`score_split`), the engine's per-request
  statistics of every row, the reference rows (true pCTR, base rate), points and bootstrap
  intervals (:func:`final_figures`, :func:`calibration_report`, :func:`compare_figures`), and the
  streaming validation metrics of any scores (:func:`evaluate_logits`, :func:`evaluate_model`).
- ``tables.py``: the text: result tables, interval cells, the position offsets, comparisons.
"""

from hybridrank._lazy import lazy_exports

_FIGURES = ("TABLE_COLUMNS", "EVAL_COLUMNS", "COMPARE_METRICS", "ScoredSplit", "score_split",
            "reference_rows", "model_statistics", "points", "final_figures", "calibration_report",
            "Comparison", "score_file_statistics", "compare_figures", "evaluate_chunks",
            "evaluate_logits", "evaluate_model")
_TABLES = ("interval_cell", "format_table", "format_offsets", "level_sentence", "summary_row",
           "format_calibration_report", "format_comparison", "compare_scores")
_EXPORTS = {**{n: "hybridrank.evaluation.figures" for n in _FIGURES},
            **{n: "hybridrank.evaluation.tables" for n in _TABLES}}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
