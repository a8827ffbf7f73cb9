"""The console scripts (pyproject's ``[project.scripts]``): each notes when the process started,
imports its command, runs the command's ``main``, and ends the process as soon as it has finished.

Ending it: the ``atexit`` handlers run (logging's, which flushes and closes the run's log file,
coverage's, ...), stdout and stderr are flushed, and the process exits with ``os._exit``, without
the interpreter's teardown. That teardown frees every object of torch, Lightning and the run one
at a time, to no one's benefit (the operating system takes a process's memory back at once):
measured on 2 cores, ~1.2 s after any command and 2-3 s after a one-epoch training run on
3.24M impressions.
A command that fails (an exception, ``SystemExit``) or leaves a thread of its own running ends
the ordinary way.

The functions of the commands (``hybridrank.cli.train.train_main`` ...) stay what tests and other
programs call in-process: only these wrappers end the process.
"""

from __future__ import annotations

import time

#: when this process started running our code, before torch and Lightning are imported (the
#: interpreter's own start, ~0.03 s, is before it)
STARTED = time.perf_counter()

import atexit  # noqa: E402
import importlib  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
from collections.abc import Callable  # noqa: E402

from hybridrank.cli import _app  # noqa: E402  (the standard library only: cheap)

__all__ = ["train", "resume", "simulate", "export", "evaluate", "auction", "compare", "end_process"]


def end_process(code: int) -> None:
    """End this process with ``code`` now: ``atexit`` handlers, a flush of stdout / stderr, then
    ``os._exit``. Returns (and the process ends the ordinary way) while a thread other than the
    main one and daemons is still running: its work would be cut short."""
    if any(t.is_alive() and not t.daemon for t in threading.enumerate()
           if t is not threading.main_thread()):
        return
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (BrokenPipeError, ValueError):  # the reader left (`... | head`), or it is closed
            code = code or 1
    os._exit(code)


def _run(module: str, name: str) -> None:
    _app.note_process_start(STARTED)
    code = getattr(importlib.import_module(module), name)()
    if code is None or isinstance(code, int):  # anything else: sys.exit prints it, status 1
        end_process(code or 0)
    sys.exit(code)


def _script(prog: str, module: str, name: str) -> Callable[[], None]:
    """The entry point of ``prog``: runs ``module.name`` (imported only then) through :func:`_run`."""
    def script() -> None:
        _run(module, name)

    script.__name__ = script.__qualname__ = prog.removeprefix("hybridrank-")
    script.__doc__ = f"``{prog}``: ``{module}.{name}``, then the process ends."
    script.command = (module, name)  # type: ignore[attr-defined]
    return script


train = _script("hybridrank-train", "hybridrank.cli.train", "train_main")
resume = _script("hybridrank-resume", "hybridrank.cli.train", "resume_main")
simulate = _script("hybridrank-simulate", "hybridrank.cli.simulate", "main")
export = _script("hybridrank-export", "hybridrank.cli.export", "export_main")
evaluate = _script("hybridrank-eval", "hybridrank.cli.export", "eval_main")
auction = _script("hybridrank-auction", "hybridrank.cli.auction", "main")
compare = _script("hybridrank-compare", "hybridrank.cli.compare", "main")
