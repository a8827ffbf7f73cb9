"""The console scripts as a user meets them: one clear message for errors the user can fix (no
traceback), the traceback on request, no output folder left by a run that failed before training,
``--help`` that names the app."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from hybridrank.cli import auction, compare, export, simulate, train

SCRIPTS = {
    "hybridrank-train": train.train_main,
    "hybridrank-resume": train.resume_main,
    "hybridrank-export": export.export_main,
    "hybridrank-eval": export.eval_main,
    "hybridrank-auction": auction.main,
    "hybridrank-compare": compare.main,
    "hybridrank-simulate": simulate.main,
}


@pytest.fixture
def restore_logging():
    """hydra's job logging reconfigures Python logging (root handlers bound to this test's
    captured streams, existing loggers disabled): put it back for the tests that follow."""
    root = logging.getLogger()
    saved_root = (list(root.handlers), root.level)
    saved = {name: (lg.disabled, lg.level, lg.propagate, list(lg.handlers))
             for name, lg in logging.Logger.manager.loggerDict.items()
             if isinstance(lg, logging.Logger)}
    yield
    root.handlers[:], root.level = saved_root
    for name, lg in logging.Logger.manager.loggerDict.items():
        if not isinstance(lg, logging.Logger):
            continue
        if name in saved:
            lg.disabled, lg.level, lg.propagate, lg.handlers[:] = saved[name]
        else:
            lg.disabled, lg.handlers[:] = False, []


@pytest.fixture
def run_cli(tmp_path, monkeypatch, capsys, restore_logging):
    """``run_cli(prog, *args) -> (exit code, stdout, stderr)``, in-process, in ``tmp_path``."""
    monkeypatch.chdir(tmp_path)
    for var in ("HYBRIDRANK_DEBUG", "HYDRA_FULL_ERROR", "_HYBRIDRANK_CLI_ERRORS"):
        monkeypatch.delenv(var, raising=False)

    def run(prog: str, *args: str) -> tuple[int, str, str]:
        monkeypatch.setattr(sys, "argv", [prog, *args])
        main = SCRIPTS[prog]
        try:
            code = main() if prog in ("hybridrank-train", "hybridrank-export", "hybridrank-eval",
                                      "hybridrank-resume") else main(list(args))
        except SystemExit as e:
            code = e.code
        out, err = capsys.readouterr()
        return int(code or 0), out, err

    return run


@pytest.fixture
def parquet_file(tmp_path) -> Path:
    path = tmp_path / "scores.parquet"
    pl.DataFrame({"request_id": [1, 1], "label": [1.0, 0.0], "pctr": [0.2, 0.1],
                  "bid": [1.0, 1.0]}).write_parquet(path)
    return path


def _one_message(prog: str, code: int, err: str, *needles: str) -> None:
    assert code == 2, err
    assert "Traceback" not in err and "Error executing job" not in err, err
    first = err.strip().splitlines()[0]
    assert first.startswith(f"{prog}: error: "), err
    for needle in needles:
        assert needle in first, (needle, err)
    assert "HYBRIDRANK_DEBUG=1" in err


def test_missing_data_file_one_message_and_no_output_folder(run_cli, tmp_path):
    code, _, err = run_cli("hybridrank-train", "data=letor_mq2008",
                           f"data.source.train={tmp_path}/nope.txt")
    _one_message("hybridrank-train", code, err, "LibSVM file not found", "nope.txt")
    # hydra created outputs/train/<date>/<time> (log file, .hydra/) before the job: removed
    assert not (tmp_path / "outputs").exists(), list((tmp_path / "outputs").rglob("*"))


def test_missing_real_data_says_where_it_comes_from(run_cli, tmp_path, monkeypatch):
    monkeypatch.setenv("HYBRIDRANK_REAL_DATA", str(tmp_path / "no-data-here"))
    code, _, err = run_cli("hybridrank-train", "data=mslr")
    _one_message("hybridrank-train", code, err, "not found", "$HYBRIDRANK_REAL_DATA", "data/README.md")


def test_override_parse_error_names_the_override(run_cli, tmp_path):
    # README's old quoting: bash strips the single quotes, hydra then sees a second '='
    code, _, err = run_cli("hybridrank-train", "data=clicklog_stream",
                           "data.source.path=logs/day=*/part-*.parquet")
    _one_message("hybridrank-train", code, err, "'data.source.path=logs/day=*/part-*.parquet'",
                 "mismatched input", "'key=\"value\"'")
    assert not (tmp_path / "outputs").exists()


@pytest.mark.parametrize("args, needles", [
    (["loss=nope"], ["Could not find 'loss/nope'", "bce_softmax"]),
    (["trainer.max_epoch=3"], ["trainer.max_epoch", "not in struct"]),
    (["+data.source.n_user=3"], ["n_user", "config node data.source"]),
])
def test_config_errors_are_one_message(run_cli, tmp_path, args, needles):
    code, _, err = run_cli("hybridrank-train", *args)
    _one_message("hybridrank-train", code, err, *needles)
    assert not (tmp_path / "outputs").exists()


def test_export_of_a_parquet_file_says_it_is_not_a_checkpoint(run_cli, parquet_file, tmp_path):
    code, _, err = run_cli("hybridrank-export", f"checkpoint={parquet_file}")
    _one_message("hybridrank-export", code, err, "is not a checkpoint (a parquet file)")
    assert "weights_only" not in err  # torch's advice does not apply to a parquet file
    assert not (tmp_path / "outputs").exists()


@pytest.mark.slow
@pytest.mark.parametrize("prog", ["hybridrank-export", "hybridrank-eval"])
def test_export_and_eval_name_missing_inputs(run_cli, tmp_path, prog):
    code, _, err = run_cli(prog)
    _one_message(prog, code, err, "missing mandatory value checkpoint")
    code, _, err = run_cli(prog, f"checkpoint={tmp_path}/none.ckpt")
    _one_message(prog, code, err, "checkpoint not found", "none.ckpt")
    (tmp_path / "run").mkdir()
    code, _, err = run_cli(prog, f"checkpoint={tmp_path}/run")
    _one_message(prog, code, err, "a folder without metrics.json")
    assert not (tmp_path / "outputs").exists()


def test_a_text_file_and_a_damaged_checkpoint(run_cli, tmp_path):
    (tmp_path / "notes.txt").write_text("hello\n")
    code, _, err = run_cli("hybridrank-export", f"checkpoint={tmp_path}/notes.txt")
    _one_message("hybridrank-export", code, err, "is not a checkpoint (a text file)")
    (tmp_path / "cut.ckpt").write_bytes(b"PK\x03\x04" + b"\x00" * 40)  # a zip header, nothing else
    code, _, err = run_cli("hybridrank-export", f"checkpoint={tmp_path}/cut.ckpt")
    _one_message("hybridrank-export", code, err, "is not a readable hybridrank checkpoint")


def test_resume_errors(run_cli, tmp_path):
    code, _, err = run_cli("hybridrank-resume", str(tmp_path / "nope"))
    _one_message("hybridrank-resume", code, err, "no such run folder")
    (tmp_path / "some").mkdir()
    code, _, err = run_cli("hybridrank-resume", str(tmp_path / "some"))
    _one_message("hybridrank-resume", code, err, "not a hybridrank-train output folder")


def test_argparse_scripts(run_cli, tmp_path, parquet_file):
    code, _, err = run_cli("hybridrank-simulate", "--out", str(tmp_path / "x.txt"))
    _one_message("hybridrank-simulate", code, err, "--out must end in .parquet or .csv")
    code, _, err = run_cli("hybridrank-auction", str(tmp_path / "missing.parquet"))
    assert code == 2 and "Traceback" not in err and "missing.parquet" in err
    code, _, err = run_cli("hybridrank-compare", str(parquet_file), "--score-column", "nope")
    assert code == 2 and "Traceback" not in err and "nope" in err


def test_debug_shows_the_traceback(run_cli, tmp_path, monkeypatch):
    monkeypatch.setenv("HYBRIDRANK_DEBUG", "1")
    with pytest.raises(FileNotFoundError, match="LibSVM file not found"):
        run_cli("hybridrank-train", "data=letor_mq2008", f"data.source.train={tmp_path}/nope.txt")


def test_bugs_keep_their_traceback(run_cli, monkeypatch):
    def broken(cfg):
        raise RuntimeError("a bug, not a user error")

    monkeypatch.setattr(train, "train", broken)
    with pytest.raises(RuntimeError, match="a bug"):
        run_cli("hybridrank-train")


def test_user_message_classifies():
    from hydra.errors import InstantiationException

    from hybridrank.cli._app import user_message

    assert user_message(ValueError("bad label")) == "bad label"
    assert user_message(RuntimeError("CUDA error")) is None
    assert user_message(KeyError("x")) is None
    wrapped = InstantiationException("Error in call to target 'x':\nfull_key: data.source")
    wrapped.__cause__ = FileNotFoundError("file not found: a.txt")
    assert user_message(wrapped) == "file not found: a.txt (config node data.source)"
    bug = InstantiationException("Error in call to target 'x':\nfull_key: model")
    bug.__cause__ = RuntimeError("shape mismatch")
    assert user_message(bug) is None


@pytest.mark.slow
@pytest.mark.parametrize("prog", ["hybridrank-train", "hybridrank-export", "hybridrank-eval"])
def test_help_names_the_app(run_cli, prog):
    code, out, _ = run_cli(prog, "--help")
    assert code == 0
    assert out.startswith(f"{prog}: every option is a hydra override")
    assert "powered by Hydra" not in out
    assert "HYBRIDRANK_DEBUG=1" in out


CONSOLE_ERRORS = [
    ("hybridrank-train", ["data=letor_mq2008", "data.source.train=/nope/x.txt"], "LibSVM file not found"),
    ("hybridrank-export", ["checkpoint=scores.parquet"], "is not a checkpoint (a parquet file)"),
]


@pytest.mark.slow
def test_console_scripts_print_one_message(tmp_path, parquet_file):
    """The installed entry points (not the functions): exit status 2, one message, no folder.
    The real executables, side by side (each pays its imports)."""
    env = {k: v for k, v in os.environ.items() if k not in ("HYBRIDRANK_DEBUG", "HYDRA_FULL_ERROR")}
    procs = {}
    for prog, args, needle in CONSOLE_ERRORS:
        exe = Path(sys.executable).with_name(prog)
        if not exe.exists():
            pytest.skip(f"{prog} is not installed in this environment (pip install -e .)")
        (tmp_path / prog).mkdir()
        (tmp_path / prog / parquet_file.name).write_bytes(parquet_file.read_bytes())
        procs[prog] = (subprocess.Popen([str(exe), *args], cwd=tmp_path / prog, env=env, text=True,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE), needle)
    for prog, (proc, needle) in procs.items():
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 2, (prog, err)
        assert "Traceback" not in err and needle in err.splitlines()[0], (prog, err)
        assert not (tmp_path / prog / "outputs").exists(), prog


NOISE = ("💡 Tip", "litlogger", "LeafSpec", "index_reduce", "sync_dist", "Traceback",
         "is powered by Hydra", "was configured so 100%")


@pytest.mark.slow
def test_console_is_quiet(tmp_path):
    """A default run prints none of our own warnings and none of the third-party noise we cause:
    Lightning's tip advert, torch's LeafSpec deprecation (raised by Lightning), index_reduce's beta
    warning, Lightning's note on a batch limit given as 1.0, and under DDP one sync_dist warning
    per logged metric. The real executable (import-time warnings included), on one process and
    under DDP, the two runs side by side."""
    exe = Path(sys.executable).with_name("hybridrank-train")
    if not exe.exists():
        pytest.skip("hybridrank-train is not installed in this environment (pip install -e .)")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONWARNINGS",)}
    env["OMP_NUM_THREADS"] = "1"
    procs = {}
    for trainer in ("cpu", "ddp_cpu"):
        (tmp_path / trainer).mkdir()
        procs[trainer] = subprocess.Popen(
            [str(exe), f"trainer={trainer}", "data.source.n_users=150", "trainer.max_epochs=1",
             "intervals.n_boot=0", "hydra.run.dir=run"], cwd=tmp_path / trainer,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    for trainer, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=900)
        text = stdout + stderr
        assert proc.returncode == 0, (trainer, text[-4000:])
        assert "this model" in stdout, trainer
        found = [n for n in NOISE if n in text]
        assert not found, (trainer, found, text[-4000:])


@pytest.mark.slow
def test_export_and_eval_report_once_and_readably(run_cli, tmp_path):
    """The export's row count is printed once, the calibrator=auto decision is one line (not a
    dict), the correction is words; a run folder stands for its best checkpoint."""
    code, out, err = run_cli("hybridrank-train", "data.source.n_users=80", "trainer.max_epochs=1",
                             "intervals.n_boot=0", "hydra.run.dir=run")
    assert code == 0, err[-3000:]
    code, out, err = run_cli("hybridrank-export", "checkpoint=run", "output=scores.parquet",
                             "hydra.run.dir=export")
    text = out + err
    assert code == 0, text[-3000:]
    assert len(re.findall(r"wrote \d+ rows to", text)) == 1, text
    decision = [ln for ln in text.splitlines() if "calibrator auto chose" in ln]
    assert len(decision) == 1 and "level over time" in decision[0], text
    assert "{'none'" not in text and "'cv_logloss'" not in text  # no raw dict on the console
    assert "negative-downsampling correction (auto): not applied" in text
    assert (tmp_path / "scores.parquet").is_file()
    code, out, err = run_cli("hybridrank-eval", "checkpoint=run", "n_boot=20", "figures=false",
                             "hydra.run.dir=eval")
    assert code == 0, (out + err)[-3000:]
    assert sum("calibrator auto chose" in ln for ln in (out + err).splitlines()) == 1


def test_export_column_overrides_compose(compose_cfg):
    """docs/EXPORT.md's `'columns={bid: bid_usd}'` is accepted (the node was an empty struct dict
    that rejected every key; found by tests/test_readme.py)."""
    cfg = compose_cfg("export", "checkpoint=x.ckpt", "columns={bid: bid_usd, label: null}")
    assert dict(cfg.columns) == {"bid": "bid_usd", "label": None}
    assert compose_cfg("export", "checkpoint=x.ckpt").columns is None


def test_gpu_trainer_without_a_gpu_is_one_line_and_leaves_no_folder(run_cli, tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    code, _, err = run_cli("hybridrank-train", "trainer=gpu", "hydra.run.dir=gpu_run")
    _one_message("hybridrank-train", code, err, "asks for a CUDA GPU", "no CUDA GPU", "CPU core",
                 "trainer=cpu")
    assert not (tmp_path / "gpu_run").exists()


@pytest.mark.parametrize("devices, fix", [(4, "trainer.devices=2"), ("[0,3]", "ids 0..1")])
def test_more_gpus_than_the_machine_has_is_one_line(run_cli, tmp_path, monkeypatch, devices, fix):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "Fake GPU")
    code, _, err = run_cli("hybridrank-train", "trainer=gpu", f"trainer.devices={devices}",
                           "hydra.run.dir=gpu_run")
    _one_message("hybridrank-train", code, err, "2 CUDA GPU(s): Fake GPU", fix)
    assert not (tmp_path / "gpu_run").exists()
