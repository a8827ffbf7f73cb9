"""The console scripts' wrappers (hybridrank/cli/console.py): a finished command ends its process
at once, but nothing it wrote or registered is lost, and its exit status is kept."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hybridrank.cli import _app
from hybridrank.cli.train import time_line

COMMAND = '''
import atexit, sys, threading, time
from pathlib import Path

def main():
    out = Path(sys.argv[1])
    # logging-like: an atexit handler that writes what the run buffered
    atexit.register(lambda: (out / "atexit.txt").write_text("flushed"))
    sys.stdout.write("x" * 200_000 + "\\nend of output\\n")   # more than one pipe buffer
    if "thread" in sys.argv:
        def work():
            time.sleep(0.5)
            (out / "thread.txt").write_text("done")
        threading.Thread(target=work).start()     # a non-daemon thread still running
    if "fail" in sys.argv:
        raise SystemExit(3)
    return int(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[2].isdigit() else None
'''


def run_command(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    (tmp_path / "fake_command.py").write_text(textwrap.dedent(COMMAND))
    code = ("import sys; sys.path.insert(0, sys.argv.pop(1)); from hybridrank.cli import console; "
            "console._run('fake_command', 'main')")
    return subprocess.run([sys.executable, "-c", code, str(tmp_path), str(tmp_path), *args],
                          capture_output=True, text=True, timeout=120)


def test_finished_command_flushes_output_and_runs_atexit(tmp_path):
    done = run_command(tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.endswith("end of output\n") and len(done.stdout) == 200_000 + 15
    assert (tmp_path / "atexit.txt").read_text() == "flushed"


def test_exit_status_of_the_command_is_kept(tmp_path):
    assert run_command(tmp_path, "4").returncode == 4
    done = run_command(tmp_path, "fail")
    assert done.returncode == 3 and (tmp_path / "atexit.txt").read_text() == "flushed"


def test_a_running_thread_is_not_cut_short(tmp_path):
    done = run_command(tmp_path, "thread")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "thread.txt").read_text() == "done"


def test_process_start_goes_to_the_first_run_only():
    _app.note_process_start(12.5)
    assert _app.take_process_start() == 12.5
    assert _app.take_process_start() is None  # a second trial of a sweep paid no imports


@pytest.mark.parametrize("with_start", [False, True])
def test_time_line_names_the_start_when_known(with_start):
    t = {"read": 1.0, "fit": 7.0, "training": 5.5, "validation": 1.0, "evaluate": 1.5}
    if with_start:
        t["start"] = 4.0
    line = time_line({"seconds": 9.5 + 4.0 * with_start, "time": t})
    assert line.startswith("wall time: 13.5 s = start 4.0 + read 1.0" if with_start
                           else "wall time: 9.5 s = read 1.0")


def test_every_console_script_goes_through_the_wrappers():
    """pyproject's scripts point at hybridrank.cli.console, whose wrappers name commands that exist."""
    import importlib

    import tomllib

    from hybridrank.cli import console

    root = Path(__file__).resolve().parents[1]
    scripts = tomllib.loads((root / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts, "no console scripts declared"
    for name, target in scripts.items():
        module, func = target.split(":")
        assert module == "hybridrank.cli.console", f"{name} -> {target} skips the wrapper"
        module_name, main = getattr(console, func).command
        assert callable(getattr(importlib.import_module(module_name), main)), f"{name}: {module_name}.{main}"


def test_a_reader_that_leaves_is_not_an_error_of_the_run(tmp_path):
    """``hybridrank-... | head``: the broken pipe reaches cli_errors as itself (exit 1, no error
    message), not as a user error that would print one and discard the run's folder."""
    from omegaconf import OmegaConf

    def task(cfg):
        raise BrokenPipeError(32, "Broken pipe")

    with pytest.raises(BrokenPipeError):
        _app.hydra_job(task)(OmegaConf.create({}))


@pytest.mark.slow
def test_the_test_server_has_every_command_imported_before_a_call(cli_server):
    """tests/cli_server.py exists so that the README's ~40 commands do not pay torch's and
    Lightning's imports each: the wrappers import their command only when called, so the server
    must import the commands themselves (when it imported the wrappers only, every served call
    paid ~5 s of imports and the suite ran past its budget)."""
    if cli_server is None:
        pytest.skip("HYBRIDRANK_TEST_REAL_PROCESSES=1: no server")
    from hybridrank.cli import console

    modules = sorted({getattr(console, n).command[0] for n in console.__all__
                      if hasattr(getattr(console, n), "command")})
    code = ("import sys; m = sys.argv[1:]; "
            "print([x for x in m if x not in sys.modules]); print('torch' in sys.modules)")
    p = subprocess.run([cli_server.python, "-c", code, *modules], capture_output=True, text=True,
                       timeout=60, env=cli_server.env())
    assert p.returncode == 0, p.stderr
    assert p.stdout.split("\n")[:2] == ["[]", "True"], (modules, p.stdout)
