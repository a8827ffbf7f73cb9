"""What every console script shares: errors the user can fix print one message, not a traceback.

Our own errors -- bad data, a bad config or override, a missing or wrong file, a file that is
not a checkpoint -- are ``ValueError`` / ``OSError`` (and hydra's, omegaconf's and polars'
errors about configs and files). A console script prints them as one message on stderr and
exits with status 2::

    hybridrank-export: error: scores.parquet is not a checkpoint (a parquet file): ...
    (HYBRIDRANK_DEBUG=1 shows the traceback)

Anything else is a bug and keeps its traceback. ``HYBRIDRANK_DEBUG=1`` (or hydra's own
``HYDRA_FULL_ERROR=1``) shows the traceback of every error.

A hydra run that fails with such an error before it trained anything leaves no output folder
(hydra creates it, with its ``.hydra/`` and log file, before the job starts).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shutil
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

__all__ = ["DEBUG_ENV", "cli_errors", "user_message", "hydra_job", "discard_failed_run",
           "quiet_third_party", "abort", "note_process_start", "take_process_start"]

DEBUG_ENV = "HYBRIDRANK_DEBUG"
#: set in the environment while a console script hands hydra's errors to us (so that a child
#: process, e.g. a DDP rank, does not take the inherited HYDRA_FULL_ERROR for a user's request)
_OURS = "_HYBRIDRANK_CLI_ERRORS"
EXIT_USER_ERROR = 2
T = TypeVar("T")
_process_start: list[float] = []  # time.perf_counter() when a console script's process started


def note_process_start(started: float) -> None:
    """Record when this console script's process started (``hybridrank.cli.console``)."""
    _process_start[:] = [started]


def take_process_start() -> float | None:
    """The start noted by the console script, once: the first run of the process (under a sweep,
    the first trial) is the one that paid for the imports and the config; later calls, and runs
    called in-process by other programs, get ``None``."""
    return _process_start.pop() if _process_start else None


def debug_requested() -> bool:
    """``HYBRIDRANK_DEBUG=1``, or ``HYDRA_FULL_ERROR=1`` set by the user (not by us)."""
    if os.environ.get(DEBUG_ENV, "") not in ("", "0"):
        return True
    return os.environ.get("HYDRA_FULL_ERROR") == "1" and not os.environ.get(_OURS)


def _user_error_types() -> tuple[type[BaseException], ...]:
    import pickle

    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    types: list[type[BaseException]] = [ValueError, OSError, HydraException, OmegaConfBaseException,
                                        pickle.UnpicklingError]
    try:
        import polars.exceptions as ple

        types.append(ple.PolarsError)
    except ImportError:  # pragma: no cover - polars is a dependency
        pass
    return tuple(types)


def user_message(exc: BaseException) -> str | None:
    """The message of an error the user can fix, or None when it is a bug (keep the traceback).

    hydra's ``InstantiationException`` wraps what a constructor raised: the message is the
    cause's, with the config node it came from. An override hydra cannot parse is named.
    """
    from hydra.errors import InstantiationException, OverrideParseException

    if isinstance(exc, OverrideParseException):
        return (f"cannot parse the override {exc.override!r}: {exc.message.splitlines()[0]}. "
                "In a value with '=', spaces or other special characters, quote the value for "
                "hydra inside the shell's quotes: 'key=\"value\"' "
                "(https://hydra.cc/docs/advanced/override_grammar/basic/)")
    if isinstance(exc, InstantiationException):
        text = str(exc)
        key = next((line.removeprefix("full_key: ").strip() for line in text.splitlines()
                    if line.startswith("full_key: ")), None)
        cause = exc.__cause__
        inner = user_message(cause) if cause is not None else None
        if inner is None and isinstance(cause, TypeError):  # a wrong keyword in a config node
            inner = str(cause)
        if inner is None:
            return None if cause is not None else text
        return f"{inner} (config node {key})" if key else inner
    if not isinstance(exc, _user_error_types()):
        return None
    from hydra.errors import HydraException
    from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

    if isinstance(exc, MissingMandatoryValue):
        key = getattr(exc, "full_key", None) or str(exc).splitlines()[0].rsplit(" ", 1)[-1]
        return f"missing mandatory value {key}: give it on the command line ({key}=...)"
    if isinstance(exc, OmegaConfBaseException):
        return str(exc).strip().splitlines()[0]
    if isinstance(exc, HydraException):
        return _missing_sweeper(str(exc)) or _compact_hydra(exc)
    text = str(exc).strip()
    if isinstance(exc, OSError) and not text:
        text = repr(exc)
    if isinstance(exc, FileNotFoundError) and exc.filename and str(exc.filename) not in text:
        text = f"{text}: {exc.filename}"
    return _real_data_hint(text or type(exc).__name__)


#: how to install a hydra sweeper plugin that a config names (hydra/sweeper=<name>)
SWEEPER_PLUGINS = {"optuna": "pip install 'hybridrank[search]' (hydra-optuna-sweeper, hydra's Optuna "
                             "sweeper plugin)"}


def _missing_sweeper(text: str) -> str | None:
    """The fix when a config names a hydra sweeper whose plugin is not installed (hydra then
    cannot find ``hydra/sweeper/<name>``, the config the plugin registers), else None."""
    import re

    found = re.search(r"Could not (?:find|load) 'hydra/sweeper/(\w+)", text)
    if not found:
        return None
    name = found.group(1)
    fix = SWEEPER_PLUGINS.get(name, f"pip install hydra-{name}-sweeper")
    return (f"the {name} sweeper (hydra/sweeper={name}, used by hparams_search=...) is not installed "
            f"or does not import: {fix}")


def _real_data_hint(text: str) -> str:
    """Add where the shared real data comes from to an error about a file inside it."""
    try:
        from hybridrank.conf import REAL_DATA_ENV, real_data_dir
    except ImportError:  # pragma: no cover - the configs are part of the package
        return text
    root = str(Path(real_data_dir()))
    if root in text and ("not found" in text or "No such file" in text or "match" in text):
        text += (f" (the shared real data folder {root}: ${REAL_DATA_ENV}, default ../shared/data "
                 f"beside the repository; see data/README.md)")
    return text


def _compact_hydra(exc: BaseException) -> str:
    """hydra's composition errors on one line: its cause (``Key 'x' is not in struct``) added,
    lists of options joined, the config search path left out."""
    from omegaconf.errors import OmegaConfBaseException

    lines = [ln.strip() for ln in str(exc).strip().splitlines()]
    if "Config search path:" in lines:
        lines = lines[:lines.index("Config search path:")]
    out: list[str] = []
    options: list[str] = []
    for ln in lines:
        if not ln:
            continue
        if ln.startswith("Available options in"):
            out.append(ln.rstrip(":") + ": ")
            options = []
            out.append(options)  # type: ignore[arg-type]
        elif out and isinstance(out[-1], list):
            options.append(ln)
        else:
            out.append(ln)
    text = " ".join(", ".join(x) if isinstance(x, list) else
                    (x if x.endswith(": ") else x.rstrip(".") + ".") for x in out)
    cause = exc.__cause__
    if isinstance(cause, OmegaConfBaseException) and str(cause).strip():
        text += " " + str(cause).strip().splitlines()[0]
    return text.replace(":  ", ": ").strip()


def discard_failed_run(run_dir: str | Path) -> bool:
    """Remove a hydra run folder that holds nothing of value (a run that failed before training).

    Nothing of value: only hydra's ``.hydra/``, log files, the resume config and an empty or
    metrics-less ``logs/``; a folder with checkpoints, scores or any other file is kept. Parent
    folders left empty by it (``outputs/train/<date>``) go too, up to the working directory.
    Returns whether it was removed.
    """
    run_dir = Path(run_dir).resolve()
    if not run_dir.is_dir():
        return False
    keep_out = {".hydra", "resume_config.yaml"}
    for entry in run_dir.iterdir():
        if entry.name in keep_out or (entry.is_file() and entry.suffix == ".log"):
            continue
        if entry.name == "logs" and entry.is_dir() and not (entry / "metrics.csv").exists():
            continue
        return False
    shutil.rmtree(run_dir, ignore_errors=True)
    cwd = Path.cwd().resolve()
    parent = run_dir.parent
    while cwd in parent.parents and not any(parent.iterdir()):
        parent.rmdir()
        parent = parent.parent
    return True


class _Abort(BaseException):
    """A user error caught inside a hydra job: a BaseException, so hydra's job runner (which
    catches ``Exception``) lets it through without its ``Error executing job`` report."""

    def __init__(self, message: str, original: BaseException):
        super().__init__(message)
        self.message = message
        self.original = original


def abort(exc: BaseException) -> BaseException:
    """A user error raised where hydra catches ``Exception`` (its job runner; its callbacks, which
    turn an exception into a warning and carry on): ``raise abort(exc) from exc`` ends the command
    with the one message of :func:`cli_errors` (the traceback with ``HYBRIDRANK_DEBUG=1``).
    An error that is not the user's (a bug) is returned as it is."""
    message = user_message(exc)
    return exc if message is None else _Abort(message, exc)


def hydra_job(fn: Callable[..., T]) -> Callable[..., T]:
    """Decorate a hydra task function (under ``@hydra.main``): a user error removes the run's
    output folder when it holds nothing of value (:func:`discard_failed_run`) and leaves the
    job as one message (printed by :func:`cli_errors` around the console script)."""

    @functools.wraps(fn)
    def job(cfg, *args: Any, **kwargs: Any) -> T:
        try:
            return fn(cfg, *args, **kwargs)
        except BrokenPipeError:  # the reader of stdout left (`... | head`): cli_errors' case
            raise
        except Exception as exc:
            message = user_message(exc)
            if message is None:
                raise
            if not cfg.get("resume"):  # a resumed run's folder holds the earlier run
                try:
                    from hydra.core.hydra_config import HydraConfig

                    discard_failed_run(HydraConfig.get().runtime.output_dir)
                except ValueError:  # not under hydra (called in-process)
                    pass
            if debug_requested():
                raise
            raise _Abort(message, exc) from exc

    return job


def cli_errors(prog: str) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """Decorate a console script's ``main``: user errors -> one message on stderr, exit 2.

    Around a ``@hydra.main`` function it asks hydra to re-raise (``HYDRA_FULL_ERROR``) so that
    composition errors (a config option that does not exist, a bad override) come here too.
    """

    def wrap(main: Callable[..., T]) -> Callable[..., T]:
        @functools.wraps(main)
        def run(*args: Any, **kwargs: Any) -> T:
            debug = debug_requested()
            saved = {k: os.environ.get(k) for k in ("HYDRA_FULL_ERROR", _OURS, DEBUG_ENV)}
            # hydra re-raises everything to us; child processes (DDP ranks) inherit the decision
            os.environ["HYDRA_FULL_ERROR"] = "1"
            os.environ[_OURS] = "1"
            if debug:
                os.environ[DEBUG_ENV] = "1"
            try:
                return main(*args, **kwargs)
            except _Abort as stop:
                if debug:
                    raise stop.original from None
                _report(prog, stop.message)
            except BrokenPipeError:  # `... | head`: the reader left; not an error of the run
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, sys.stdout.fileno())
                raise SystemExit(1) from None
            except Exception as exc:
                message = None if debug else user_message(exc)
                if message is None:
                    raise
                _report(prog, message)
            finally:
                for k, v in saved.items():
                    if v is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = v
            raise SystemExit(EXIT_USER_ERROR)

        return run

    return wrap


def _report(prog: str, message: str) -> None:
    sys.stdout.flush()
    print(f"{prog}: error: {message}\n({DEBUG_ENV}=1 shows the traceback)", file=sys.stderr)


# ----------------------------------------------------------------------------------------------
# third-party console noise that our own use of the libraries causes
# ----------------------------------------------------------------------------------------------
class _DropAdverts(logging.Filter):
    """Lightning's "💡 Tip: ... try installing litlogger / litmodels" lines (an advert on every run)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("💡 Tip")


_ADVERTS = _DropAdverts()


def drop_adverts() -> None:
    """Filter Lightning's tip adverts out of its logger (idempotent)."""
    for name in ("pytorch_lightning.utilities.rank_zero", "lightning_fabric.utilities.rank_zero",
                 "lightning.pytorch.utilities.rank_zero", "lightning_utilities.core.rank_zero"):
        logger = logging.getLogger(name)
        if _ADVERTS not in logger.filters:
            logger.addFilter(_ADVERTS)


@contextlib.contextmanager
def quiet_third_party() -> Iterator[None]:
    """Silence third-party messages that say nothing about the user's run.

    - Lightning's tip adverts (litlogger, litmodels), logged on every ``Trainer``;
    - torch's ``LeafSpec is deprecated`` FutureWarning, raised by Lightning's own pytree helper
      on the torch versions we support: nothing a user of hybridrank can act on.

    Warnings are filtered only inside the block; the advert filter stays on Lightning's logger.
    """
    drop_adverts()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*LeafSpec.* is deprecated", category=FutureWarning)
        yield
