"""The simulators: click logs with a known true click probability.

- ``common.py``: the click model's shared pieces (sessions, requests, distinct slates, the
  intercept solved for a target click rate).
- ``clicklog.py``: the built-in simulator (``simulate_clicklog``, ``data=sim``), also drawn in
  blocks of users (``clicklog_chunks``) for logs larger than memory; ``writer.py`` writes those
  blocks to parquet / CSV as they come (``write_clicklog``, ``hybridrank-simulate``).
- ``world_spec.py`` and ``world.py``: randomly drawn "worlds" for judging defaults across many
  logs (``draw_world`` -> ``WorldSpec`` -> ``simulate_world`` -> ``World``), in families
  (``base``; ``longtail``: an ad log's long tails).

``hybridrank.data.simulate`` and ``hybridrank.data.worlds`` re-export the public names.
"""

from hybridrank._lazy import lazy_exports

_EXPORTS = {
    "simulate_clicklog": "hybridrank.data.simulators.clicklog",
    "clicklog_chunks": "hybridrank.data.simulators.clicklog",
    "SIM_COLUMNS": "hybridrank.data.simulators.clicklog",
    "CHUNK_USERS": "hybridrank.data.simulators.clicklog",
    "write_clicklog": "hybridrank.data.simulators.writer",
    "LogSummary": "hybridrank.data.simulators.writer",
    "WorldSpec": "hybridrank.data.simulators.world_spec",
    "draw_world": "hybridrank.data.simulators.world_spec",
    "FAMILIES": "hybridrank.data.simulators.world_spec",
    "World": "hybridrank.data.simulators.world",
    "simulate_world": "hybridrank.data.simulators.world",
    "draw_population": "hybridrank.data.simulators.world",
    "load_world": "hybridrank.data.simulators.world",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
