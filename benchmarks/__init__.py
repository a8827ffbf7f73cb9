"""hybridrank's benchmark suite (not part of the installed package): ``python -m benchmarks.<name>``
from the repository root.

Shared pieces: :mod:`~benchmarks.common` (the protocols, the world benchmarks' options, the docs
sections), :mod:`~benchmarks.grid` (every hybridrank training: ``train(cfg)`` over grids of hydra
overrides x seeds), :mod:`~benchmarks.baselines` (the reference FM, LightGBM) and
:mod:`~benchmarks.worlds` (the world harness). The benchmarks, their protocols, figures and commands:
docs/BENCHMARKS.md and the README's table.
"""
