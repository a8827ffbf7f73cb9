"""Command-line entry points, thin shells over the package: ``train.py`` (``hybridrank-train``,
``hybridrank-resume``, the importable ``train(cfg)``), ``export.py`` (``hybridrank-export``,
``hybridrank-eval``), ``auction.py``, ``compare.py``, ``simulate.py``; ``callbacks.py`` holds the
console log line of training runs."""
