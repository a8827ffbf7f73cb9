"""The built-in click-log simulator (re-exported from :mod:`hybridrank.data.simulators.clicklog`,
where it lives with the world generator)."""

from hybridrank.data.simulators.clicklog import (
    CHUNK_USERS,
    SIM_COLUMNS,
    clicklog_chunks,
    simulate_clicklog,
)
from hybridrank.data.simulators.writer import write_clicklog

__all__ = ["simulate_clicklog", "clicklog_chunks", "write_clicklog", "SIM_COLUMNS", "CHUNK_USERS"]
