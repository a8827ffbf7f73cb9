"""A fork server for the console scripts, so that tests which run many commands do not pay the
imports of every one.

Starting ``hybridrank-train`` costs about 7 s of imports on two cores (torch, Lightning, which
pulls in ``torch._dynamo``, hydra, polars) before it does anything; the README's commands pay it
about forty times. The server imports the console scripts' modules once, then serves each call
in a fresh child process forked from that state: the child *is* the console script, with the
call's argv, environment, working directory and stdin / stdout / stderr (passed over a unix
socket as file descriptors), and its exit status goes back to the caller. A small launcher named
like each console script (``bin/hybridrank-train`` ...) stands first on the ``PATH`` of the
commands, so a shell command runs exactly as written. A launcher for Python itself
(``hybridrank-test-python -c CODE ...`` or ``... SCRIPT ...``; not on the PATH under the name
``python``) serves the benchmark scripts and test workers that tests run as subprocesses; a child
killed by a signal kills its launcher with the same signal, so a caller sees what the real process
would have shown (``returncode == -SIGKILL``).

What it does not check, and where that is checked instead: the console-script wrappers that pip
writes (the CI's wheel step runs the real executables outside the checkout), and warnings
printed while importing (tests/test_cli.py runs the real executables for the quiet-console
tests). ``HYBRIDRANK_TEST_REAL_PROCESSES=1`` makes :func:`start` return None, and callers then
run the real executables.

Fork safety: the parent only imports (no torch op runs, so no OpenMP pool exists to be lost in a
child); every child starts from the same freshly imported state, so calls cannot leak into each
other.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from importlib.metadata import entry_points
from pathlib import Path

#: the launcher: the console script's name on the PATH; talks to the server, nothing else (-S:
#: no site import, it starts in milliseconds)
LAUNCHER = '''#!{python} -S
import json, os, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect({sock!r})
msg = json.dumps({{"prog": {prog!r}, "argv": sys.argv[1:], "cwd": os.getcwd(),
                  "env": dict(os.environ)}}).encode()
socket.send_fds(s, [len(msg).to_bytes(8, "big") + msg], [0, 1, 2])
status = b""
while len(status) < 4:
    part = s.recv(4 - len(status))
    if not part:
        sys.exit("hybridrank test server: the connection closed before an exit status")
    status += part
code = int.from_bytes(status, "big", signed=True)
if code < 0:  # the child died of a signal: die of the same one, as the real process would
    import signal
    if -code not in (signal.SIGKILL, signal.SIGSTOP):  # those two have no handler to reset
        signal.signal(-code, signal.SIG_DFL)
    os.kill(os.getpid(), -code)
sys.exit(code)
'''


#: the launcher for Python itself (``-c CODE`` or ``SCRIPT``, with arguments): the scripts and
#: workers that tests run in a subprocess, served like the console scripts
PYTHON = "hybridrank-test-python"


def console_scripts() -> dict[str, str]:
    """``{name: "module:function"}`` of hybridrank's installed console scripts."""
    return {ep.name: ep.value for ep in entry_points(group="console_scripts")
            if ep.value.startswith("hybridrank.")}


def _recv_exact(conn: socket.socket, n: int, fds: list[int]) -> bytes:
    data = b""
    while len(data) < n:
        part, got, _, _ = socket.recv_fds(conn, n - len(data), 8)
        fds.extend(got)
        if not part:
            raise ConnectionError("the launcher closed the connection")
        data += part
    return data


def _run_python(argv: list[str], env: dict[str, str]) -> None:
    """What ``python -c CODE ARGS`` or ``python SCRIPT ARGS`` does, in this process: sys.argv and
    sys.path[0] as Python sets them, the call's PYTHONPATH and PYTHONWARNINGS applied."""
    import runpy
    import warnings

    code = argv[:1] == ["-c"] and len(argv) >= 2
    if not code and not (argv and not argv[0].startswith("-")):
        raise SystemExit(f"{PYTHON}: only '-c CODE ...' or 'SCRIPT ...' are served; got {argv[:2]}")
    extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if env.get("PYTHONWARNINGS"):
        warnings._processoptions(env["PYTHONWARNINGS"].split(","))  # noqa: SLF001
    if code:
        sys.argv = ["-c", *argv[2:]]
        sys.path[:0] = ["", *extra]
        exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__"})  # noqa: S102
    else:
        sys.argv = list(argv)
        sys.path[:0] = [str(Path(argv[0]).resolve().parent), *extra]
        runpy.run_path(argv[0], run_name="__main__")


def _child(request: dict, fds: list[int], scripts: dict[str, str], listener: socket.socket) -> int:
    """Runs in the forked child: become the console script and return its exit status."""
    listener.close()
    for target, fd in enumerate(fds[:3]):
        os.dup2(fd, target)
    for fd in fds:
        os.close(fd)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_DFL)
    sys.stdin = open(0, closefd=False)  # noqa: SIM115 - the process's own descriptors
    sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    if request["env"].get("OMP_NUM_THREADS", "").isdigit() and "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(int(request["env"]["OMP_NUM_THREADS"]))  # as at start-up
    prog = request["prog"]
    try:
        if prog == PYTHON:
            result = _run_python(request["argv"], request["env"])
        else:
            module, func = scripts[prog].split(":")
            # argv[0] is the real executable: a launcher that re-executes it (Lightning's DDP)
            # runs it
            sys.argv = [str(Path(sys.executable).parent / prog), *request["argv"]]
            if hasattr(sys.modules.get(module), "STARTED"):  # the wrappers' "start" counts from
                sys.modules[module].STARTED = time.perf_counter()  # this call, not the server's
            result = getattr(importlib.import_module(module), func)()
        code = result if isinstance(result, int) else 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if e.code is not None and not isinstance(e.code, int):
            print(e.code, file=sys.stderr)
    except BaseException:  # an uncaught error: what Python would print, exit 1
        import traceback

        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    return code


def serve(sock_path: str) -> None:
    """Import the console scripts' modules, then fork one child per connection."""
    scripts = console_scripts()
    for value in scripts.values():
        module, func = value.split(":")
        script = getattr(importlib.import_module(module), func)
        # hybridrank.cli.console's wrappers import their command only when called: import it now,
        # or every call would pay the imports this server exists to save
        command = getattr(script, "command", None)
        if command is not None:
            importlib.import_module(command[0])
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(sock_path)
    listener.listen(16)
    children: set[int] = set()

    def handle(conn: socket.socket) -> None:
        with conn:
            fds: list[int] = []
            size = int.from_bytes(_recv_exact(conn, 8, fds), "big")
            request = json.loads(_recv_exact(conn, size, fds))
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    code = _child(request, fds, scripts, listener)
                finally:
                    os._exit(code if 0 <= code < 256 else 1)
            children.add(pid)
            for fd in fds:
                os.close(fd)
            _, status = os.waitpid(pid, 0)
            children.discard(pid)
            code = os.waitstatus_to_exitcode(status)
            conn.sendall(code.to_bytes(4, "big", signed=True))  # < 0: the signal that killed it

    def stop(*_):
        for pid in list(children):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    print("ready", flush=True)
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=handle, args=(conn,), daemon=True).start()


class Server:
    """A running server and the folder whose launchers reach it (put ``bin`` first on PATH)."""

    def __init__(self, folder: Path, process: subprocess.Popen):
        self.folder, self.process = folder, process
        self.bin = folder / "bin"

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """``base`` (default os.environ) with the launchers first on the PATH."""
        env = dict(os.environ if base is None else base)
        env["PATH"] = f"{self.bin}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        return env

    @property
    def python(self) -> str:
        """The served Python: ``[server.python, "-c", code]`` or ``[server.python, script]``."""
        return str(self.bin / PYTHON)

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
        shutil.rmtree(self.folder, ignore_errors=True)


def start() -> Server | None:
    """Start a server (None where ``HYBRIDRANK_TEST_REAL_PROCESSES=1``); returns once its imports
    are done, or raises if it exits before."""
    if os.environ.get("HYBRIDRANK_TEST_REAL_PROCESSES") == "1":
        return None
    folder = Path(tempfile.mkdtemp(prefix="hr-cli-"))
    sock = str(folder / "s")
    (folder / "bin").mkdir()
    for prog in [*console_scripts(), PYTHON]:
        launcher = folder / "bin" / prog
        launcher.write_text(LAUNCHER.format(python=sys.executable, sock=sock, prog=prog))
        launcher.chmod(launcher.stat().st_mode | stat.S_IXUSR)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).parent),
                                                       os.environ.get("PYTHONPATH", "")]))
    process = subprocess.Popen([sys.executable, "-c", f"import cli_server; cli_server.serve({sock!r})"],
                               env=env, stdout=subprocess.PIPE, text=True)
    line = process.stdout.readline()  # "ready" once the imports are done; "" if it died
    if line.strip() != "ready":
        process.kill()
        raise RuntimeError(f"the console-script server did not start (said {line!r})")
    return Server(folder, process)
