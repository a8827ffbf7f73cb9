"""hybridrank's benchmark suite (not part of the installed package): ``python -m benchmarks.<name>``
from the repository root.

Shared pieces: :mod:`~benchmarks.common` (the protocols: MQ2008 folds, metric conventions, clipped
log loss, per-request standard errors, docs sections), :mod:`~benchmarks.grid` (every hybridrank
training: ``train(cfg)`` in-process over grids of hydra overrides x seeds), :mod:`~benchmarks.baselines`
(the reference FM, LightGBM) and :mod:`~benchmarks.worlds` (the world harness: draw a family of click
logs with a known truth, train variants, score them against it; also its command line).

Benchmarks: ``worlds``, ``offsets`` and ``level_trend`` (random worlds); ``letor`` and ``real``
(MQ2008, MSLR, Open Bandit against LightGBM); ``losses``, ``metrics`` and ``reader`` (speed against
allRank, torchmetrics and a plain parser); ``grid`` (any grid of overrides). docs/BENCHMARKS.md has
the protocols, the figures and the command behind each.
"""
