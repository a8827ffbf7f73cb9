"""Peak-memory probe for tests that measure a subprocess: prepend :data:`PROBE` to its script.

The script then has ``reset_peak()`` (the current RSS, after resetting the peak: Linux's
``clear_refs``; elsewhere the peak since start) and ``peak_mb()``, with polars and torch already
warmed up so their pools are part of the baseline. Call ``base = reset_peak()`` after the
script's own imports and report ``peak_mb() - base``.

Only growth over that baseline is measured, so what the installed torch build maps at import does
not enter it: the CUDA build of torch 2.14.1 takes ~3.5 GB of address space and ~300 MB more RSS
at import than the CPU wheel, yet the growths measured by test_streaming and test_sparse_ids
agreed between the two builds within ~12 MB (on a machine without a GPU, issue 20). No address-
space limit is set: a fixed ``RLIMIT_AS`` would depend on the build.
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
