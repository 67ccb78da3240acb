#!/usr/bin/env bash
# The GPU figures of docs/results/planning-gpu.md in one run, on a machine with one CUDA device where the
# package and its dependencies import:
#   1. the device-parametrised tests on CUDA (every path against its reference, no host sync);
#   2. the decode paths side by side in one process (eager, compiled or fused; nothing, the step or
#      the whole search captured as a CUDA graph);
#   3. HalfCheetah-v5, 25 envs x 1000 steps, the paper's model and search (the headline);
#   4. the whole test suite;
#   5. the decode paths at 1000 envs, and the env-count scaling table;
#   6. where the time of one plan call goes: kernels launched and their device time, per path.
# Each step has a time limit, writes its log to OUTDIR and prints its tail, so a run that is
# cut short still leaves every step that finished.
#     PYTHON=.venv/bin/python scripts/bench_gpu.sh OUTDIR [--deselect TEST ...]
# STEPS="tests-cuda rollout-25x1000" runs only the steps named; DECODES, the paths step 2 compares.
set -u
out=${1:?usage: scripts/bench_gpu.sh OUTDIR [pytest arguments for the whole suite]}
shift
mkdir -p "$out"
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
python=${PYTHON:-python3}
# pytest-xdist, where installed, runs the tests on several cores.
workers=()
if "$python" -c "import xdist" 2>/dev/null; then workers=(-n 8); fi
# Two threads per worker: with torch's default of one thread per core in every worker, the
# whole suite had run half its tests after 240 s on a 16-core machine.
tests=(env OMP_NUM_THREADS=2 MKL_NUM_THREADS=2 "$python" -m pytest)

step() {  # name, time limit in seconds, command...
    local name=$1 limit=$2 start=$SECONDS
    shift 2
    if [[ -n ${STEPS:-} && " $STEPS " != *" $name "* ]]; then return; fi
    echo "== $name"
    # SIGINT: pytest stops its workers and still prints its summary of failures.
    timeout -s INT -k 20 "$limit" "$@" >"$out/$name.log" 2>&1
    echo "== $name: exit $? after $((SECONDS - start)) s"
    tail -n "${TAIL:-12}" "$out/$name.log" | cut -c1-400
}

nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv
"$python" -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda)"

step tests-cuda 150 "${tests[@]}" -q -p no:cacheprovider "${workers[@]}" -k "cuda or fused" \
    tests/planning/test_cuda.py tests/planning/test_beam.py tests/model/test_kv_cache.py \
    tests/training/test_trainer.py tests/test_checkpoint.py tests/cli/test_eval_cli.py \
    tests/model/test_fused.py
step decode-25-envs 180 "$python" scripts/bench_planner.py --device cuda \
    --envs 25 --reps 20 --warmup 3 --greedy \
    --compare-decodes "${DECODES:-eager/search,compile/search,fused/none,fused/step,fused/search}"
step rollout-25x1000 150 "$python" scripts/bench_rollout.py --device cuda --envs 25 --steps 1000 \
    --decode fused --cuda-graph search
# -v names each test as it ends, so a run cut short still says what failed.
TAIL=40 step tests-all 240 "${tests[@]}" -v -rf -p no:cacheprovider "${workers[@]}" -k "not video" \
    --ignore=tests/test_notebooks.py --ignore=tests/test_install.py "$@"
# 1,000 envs, one decode path per process: each planner's cache is 26 GiB there, and three
# side by side did not fit on an 80 GB card. The compiled step had not finished its first call
# after 146 s at this size, so the eager one comes first.
for path in eager/search fused/search compile/search; do
    step "decode-1000-envs-${path/\//-}" 150 "$python" scripts/bench_planner.py --device cuda \
        --envs 1000 --reps 3 --warmup 1 --greedy --decode "${path%/*}" --cuda-graph "${path#*/}"
done
# One process: the kernels compiled for one env count serve the next.
step rollout-scaling 300 "$python" scripts/bench_rollout.py --device cuda --same-process \
    --envs 1,25,100,250,1000 --steps 30 --decode fused --cuda-graph search
for path in eager/search compile/search fused/search; do
    TAIL=30 step "profile-${path/\//-}" 45 "$python" scripts/bench_planner.py --device cuda \
        --envs 25 --warmup 2 --greedy --decode "${path%/*}" --cuda-graph "${path#*/}" --profile 20
done
