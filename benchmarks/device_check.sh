#!/usr/bin/env bash
# Issue 39's GPU checks in one command, sized for one lease of the `device` tool (15 minutes of
# device time a session, 10 a command): run it there from the repository root, e.g.
#
#   run(command="bash benchmarks/device_check.sh", carry=[".whl"], timeout_s=580)
#
# The device's Python has torch, Lightning, torchmetrics, numpy, scipy, pyarrow, pytest,
# pytest-xdist and hypothesis, but not polars or hydra: carry their wheels in .whl/ (ignored by
# git: `echo /.whl/ >> .git/info/exclude`), made here with the versions of this checkout's venv:
#
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
#       polars==2.1.0 polars-runtime-32==2.1.0 hydra-core==1.3.8 omegaconf==2.3.1
#   pip wheel --no-deps -w .whl antlr4-python3-runtime==4.9.3     # a source release only
#
# What it prints (and writes under $OUT, which comes back): the machine, then
#   1. the device-path tests with CUDA visible (no host read in a step, device batches equal to
#      the CPU's, the GPU preset, lazy Adam on the accelerator path);
#   2. benchmarks.train: the CPU row (all cores, fp32, 4,096, mlp, bce), then on CUDA fp32 and
#      bf16-mixed, budgets 4,096 and 65,536, mlp and dcnv2, bce (impressions/s, the Lightning
#      epoch against the plain loop, data wait, peak memory);
#   3. `hybridrank-train` on the default simulator with trainer=cpu and trainer=gpu (the result
#      table of each and its time line).
# Each part has its own time limit, so a slow part leaves time for the next. QUICK=1 shrinks
# every size (a rehearsal of the script on a machine without a GPU: it then runs the cpu rows).
set -uo pipefail
OUT=${OUT:-/tmp/device_check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if [ -d .whl ] && ! python3 -c "import polars, hydra" 2>/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD"
python3 -c "import polars, hydra, hybridrank" || { echo "polars / hydra missing: carry .whl (see the top of this file)"; exit 1; }

QUICK=${QUICK:-0}
# ~1M impressions (9,200 users); time limits (s) of the parts within one 580 s command (the
# bench prints its table at its end; a 4,096-impression GPU epoch ran at ~320k impressions/s)
USERS=9200; REPEATS=2; BUDGETS=4096,65536; T_TESTS=120; T_CPU=120; T_GPU=200; T_TRAIN=50
if [ "$QUICK" = 1 ]; then USERS=2000; REPEATS=1; BUDGETS=4096; T_TESTS=300; T_CPU=300; T_TRAIN=120; fi
CUDA=0; TRAINERS=cpu
if python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    CUDA=1; TRAINERS="cpu gpu"
fi

{
    date -u +"%F %T UTC"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
    python3 -c "import torch, pytorch_lightning as pl, os; print('torch', torch.__version__, '| Lightning', pl.__version__, '| CPU threads', torch.get_num_threads(), 'of', os.cpu_count(), '| CUDA', torch.cuda.is_available())"
} | tee "$OUT/machine.txt"

echo "== 1. device-path tests"
timeout "$T_TESTS" python3 -m pytest -o addopts="" -q -p no:cacheprovider -x \
    tests/test_step_sync.py tests/test_device_batches.py tests/test_gpu_preset.py tests/test_optim.py \
    2>&1 | tee "$OUT/tests.txt" | tail -4

echo "== 2. training throughput"
# the CPU row the GPU is compared with (all cores, fp32, the shipped budget), then the GPU grid
timeout "$T_CPU" python3 -m benchmarks.train --devices cpu --budgets 4096 --scorers mlp \
    --losses bce --users "$USERS" --repeats "$REPEATS" \
    2>&1 | grep -E "^\||^simulated" | tee "$OUT/bench_cpu.md"
if [ "$CUDA" = 1 ]; then
    timeout "$T_GPU" python3 -m benchmarks.train --devices cuda --precisions 32-true,bf16-mixed \
        --budgets "$BUDGETS" --scorers mlp,dcnv2 --losses bce --users "$USERS" --repeats "$REPEATS" \
        2>&1 | grep -E "^\||^simulated" | tee "$OUT/bench_cuda.md"
fi

echo "== 3. hybridrank-train, default simulator"
for t in $TRAINERS; do
    timeout "$T_TRAIN" python3 -m hybridrank.cli.train "trainer=$t" "hydra.run.dir=$OUT/run_$t" \
        > "$OUT/train_$t.txt" 2>&1
    echo "trainer=$t (rc $?):"; grep -E "^\| this model|^wall time" "$OUT/train_$t.txt"
done
