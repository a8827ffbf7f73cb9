"""Randomly built click-log "worlds" (re-exported from :mod:`hybridrank.data.simulators`:
``world_spec.py`` draws a spec from a seed, ``world.py`` simulates its log)."""

from hybridrank.data.simulators.world import (
    Population,
    World,
    draw_population,
    drift_logit,
    load_world,
    position_offsets,
    simulate_world,
)
from hybridrank.data.simulators.world_spec import (
    DRIFTS,
    FAMILIES,
    LOGGING,
    LONGTAIL_LATE_SHARE,
    NAMING_SCHEMES,
    POSITION_CURVES,
    SCORERS,
    SIGNALS,
    SIZES,
    TAIL_DEFAULTS,
    TIME_ORIGIN,
    TRUTH_COLUMNS,
    WorldSpec,
    draw_world,
)

__all__ = [
    "WorldSpec", "World", "Population", "draw_world", "simulate_world", "draw_population",
    "load_world", "position_offsets", "drift_logit", "NAMING_SCHEMES", "SIZES", "TRUTH_COLUMNS",
    "TIME_ORIGIN", "POSITION_CURVES", "SCORERS", "DRIFTS", "LOGGING", "SIGNALS", "FAMILIES",
    "LONGTAIL_LATE_SHARE", "TAIL_DEFAULTS",
]
