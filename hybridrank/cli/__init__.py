"""Command-line entry points, thin shells over the package: ``train.py`` (``hybridrank-train``,
``hybridrank-resume``, the importable ``train(cfg)``), ``export.py`` (``hybridrank-export``,
``hybridrank-eval``), ``auction.py``, ``compare.py``, ``simulate.py``; ``callbacks.py`` holds the
console log line of training runs and what keeps a run's history (checkpoint names, validation
records, ``metrics.csv`` across resumes); ``_app.py`` what every console script shares (errors as
one message, no folder left by a failed run, quiet third-party output); ``console.py`` the entry
points of pyproject's ``[project.scripts]``, which end a finished command's process at once."""
