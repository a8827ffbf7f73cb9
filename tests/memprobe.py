"""Peak-memory probe for tests that measure a subprocess: prepend :data:`PROBE` to its script.

The script then has ``reset_peak()`` (the current RSS, after resetting the peak: Linux's
``clear_refs``; elsewhere the peak since start) and ``peak_mb()``, with polars and torch already
warmed up so their pools are part of the baseline. Call ``base = reset_peak()`` after the
script's own imports and report ``peak_mb() - base``.
"""

PROBE = """
import re, resource
import polars as pl, torch
def status_mb(key):
    return int(re.search(key + r":\\s+(\\d+)", open("/proc/self/status").read()).group(1)) / 1024
def reset_peak():
    # Linux: writing 5 to clear_refs resets the peak RSS (VmHWM) to the current RSS, so an import
    # spike does not hide the work's peak; elsewhere fall back to ru_maxrss (peak since start)
    try:
        open("/proc/self/clear_refs", "w").write("5")
        return status_mb("VmRSS")
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
def peak_mb():
    try:
        return status_mb("VmHWM")
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
# warm up the polars and torch thread pools / allocators so they are part of the baseline
pl.DataFrame({"a": [1, 2]}).select(pl.col("a").sum()); torch.arange(10).sum()
"""
