"""The README is executable: every shell command in README.md and the docs it links to runs.

Each document's commands run in order, as written, in one fresh temporary folder per document
(a user following the document from a new folder): a command that exits non-zero fails the test
named ``<document>:<line>``. The commands are not rewritten; tiny settings come from shell
functions defined before them, which append to the console scripts' arguments (hydra and argparse
both take the last value): one epoch of at most four batches, small simulated logs, few bootstrap
resamples (``TINY`` below). Real-data commands read the shared data folder
(``HYBRIDRANK_REAL_DATA``, default ``../shared/data`` beside the repository) and are skipped
where it is missing.

Which fences run (the convention README.md states under "Contributing"):

- ```` ```bash ````: every command runs.
- ```` ```bash install ````: installs (``pip install``) and the test suite itself: never run here.
- ```` ```bash needs-gpu ````: runs only where CUDA is available.
- ```` ```bash needs-cluster ````: several GPUs, nodes or SLURM: never run here.
- ```` ```bash benchmark ````: the benchmark scripts (minutes to hours; they write
  docs/BENCHMARKS.md only with ``--write-docs``): never run here.
- ```` ```python run ````: a complete Python example, run with this interpreter (other Python
  fences are sketches and are not run).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TAGS = {"install", "needs-gpu", "needs-cluster", "benchmark"}
#: the commands that need the shared real data (the data sets of conf/data read from it)
REAL_DATA = re.compile(r"experiment=letor|data=(letor_mq2008|mslr|open_bandit)")
#: appended to every call of these programs (the last value of an option wins)
TINY = {
    "hybridrank-train": "trainer.max_epochs=1 ++trainer.limit_train_batches=4 "
                        "++trainer.limit_val_batches=4 intervals.n_boot=20",
    "hybridrank-resume": "trainer.max_epochs=1 ++trainer.limit_train_batches=4 "
                         "++trainer.limit_val_batches=4 intervals.n_boot=20",
    "hybridrank-simulate": "--n-users 300",
    "hybridrank-eval": "n_boot=20",
    "hybridrank-auction": "--n-boot 20",
    "hybridrank-compare": "--n-boot 20",
}
PREAMBLE = "\n".join(f'{prog}() {{ command {prog} "$@" {extra}; }}' for prog, extra in TINY.items())


@dataclass(frozen=True)
class Command:
    doc: str
    line: int
    lang: str
    tags: frozenset[str]
    text: str

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}"


def documents() -> list[str]:
    """README.md and the Markdown files of this repository it names (docs/*.md, data/README.md)."""
    readme = (ROOT / "README.md").read_text()
    linked = sorted(set(re.findall(r"\b((?:docs|data)/[\w-]+\.md)", readme)))
    missing = [d for d in linked if not (ROOT / d).is_file()]
    assert not missing, f"README.md names documents that do not exist: {missing}"
    return ["README.md", *linked]


def fences(doc: str) -> list[tuple[int, str, frozenset[str], list[tuple[int, str]]]]:
    """``(line of the opening fence, language, tags, [(line, text)])`` of every fenced block."""
    out, current = [], None
    for i, line in enumerate((ROOT / doc).read_text().splitlines(), start=1):
        m = re.match(r"^```(.*)$", line.strip())
        if m and current is None:
            info = m.group(1).split()
            current = (i, info[0] if info else "", frozenset(info[1:]), [])
        elif m and current is not None:
            out.append(current)
            current = None
        elif current is not None:
            current[3].append((i, line))
    assert current is None, f"{doc}: a code fence opened at line {current[0]} is never closed"
    return out


def commands(doc: str) -> list[Command]:
    """The shell commands (continuation lines joined) and runnable Python blocks of a document."""
    out = []
    for start, lang, tags, lines in fences(doc):
        if lang == "python":
            if "run" in tags:
                out.append(Command(doc, start, lang, tags, "\n".join(t for _, t in lines)))
            continue
        if lang != "bash":
            continue
        unknown = tags - TAGS
        assert not unknown, f"{doc}:{start}: unknown fence tag(s) {sorted(unknown)}; known {sorted(TAGS)}"
        text, first = "", None
        for i, line in lines:
            if not text and (not line.strip() or line.strip().startswith("#")):
                continue
            first = first or i
            text += line + "\n"
            if not line.rstrip().endswith("\\"):
                out.append(Command(doc, first, lang, tags, text.rstrip()))
                text, first = "", None
        assert not text, f"{doc}:{first}: a command ends with a line continuation"
    return out


ALL = [c for d in documents() for c in commands(d)]


def _skip_reason(cmd: Command) -> str | None:
    if "install" in cmd.tags:
        return "an install command (fence tag 'install'): not run by the test"
    if "benchmark" in cmd.tags:
        return "a benchmark (fence tag 'benchmark'): minutes to hours"
    if "needs-cluster" in cmd.tags:
        return "needs several GPUs, nodes or SLURM (fence tag 'needs-cluster')"
    if "needs-gpu" in cmd.tags:
        import torch

        if not torch.cuda.is_available():
            return "needs a CUDA GPU (fence tag 'needs-gpu')"
    if REAL_DATA.search(cmd.text):
        from hybridrank.conf import real_data_dir

        if not (Path(real_data_dir()) / "letor").is_dir():
            return f"needs the shared real data (HYBRIDRANK_REAL_DATA; not found at {real_data_dir()})"
    return None


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """One fresh working folder per document, shared by its commands in order."""
    made: dict[str, Path] = {}

    def folder(doc: str) -> Path:
        if doc not in made:
            made[doc] = tmp_path_factory.mktemp(re.sub(r"\W", "_", doc))
        return made[doc]

    return folder


def run_command(cmd: Command, cwd: Path, server=None, timeout: float = 1200) -> subprocess.CompletedProcess:
    """Run one command as written, in bash, with the tiny-settings functions defined; the
    console scripts are served by ``server`` (tests/cli_server.py) when there is one."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    if server is not None:
        env = server.env(env)
    env.pop("HYBRIDRANK_DEBUG", None)
    if cmd.lang == "python":
        script = cwd / f"example_{cmd.line}.py"
        script.write_text(cmd.text + "\n")
        args = [sys.executable, str(script)]
    else:
        args = [shutil.which("bash") or "/bin/bash", "-c", f"{PREAMBLE}\n{cmd.text}"]
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def test_the_documents_have_commands():
    """The parser finds what it should (a test that a broken parser cannot pass silently)."""
    ids = {c.id: c for c in ALL}
    assert len(ALL) >= 20, [c.id for c in ALL]
    main = [c for c in ALL if c.doc == "README.md" and "install" in c.tags]
    assert any("pip install -e . && hybridrank-train" in c.text for c in main), main
    assert any(c.text.startswith("hybridrank-export") for c in ALL)
    assert all("\\\n" not in c.text or c.lang == "bash" for c in ids.values())


def test_commands_parse_with_continuations():
    """Backslash continuations are one command; comments and blank lines are not commands."""
    joined = [c for c in ALL if "\\\n" in c.text]
    assert joined, "no multi-line command found"
    for c in joined:
        assert c.text.count("\n") >= 1 and not c.text.startswith("#")


@pytest.mark.slow
@pytest.mark.parametrize("cmd", ALL, ids=[c.id for c in ALL])
def test_command_runs(cmd: Command, folders, cli_server):
    reason = _skip_reason(cmd)
    if reason:
        pytest.skip(reason)
    p = run_command(cmd, folders(cmd.doc), cli_server)
    assert p.returncode == 0, (
        f"{cmd.id}: exit {p.returncode}\n$ {cmd.text}\n--- stderr (end) ---\n{p.stderr[-4000:]}"
        f"\n--- stdout (end) ---\n{p.stdout[-2000:]}")
    assert "Traceback" not in p.stderr, f"{cmd.id}: a traceback on stderr\n{p.stderr[-4000:]}"
