#!/usr/bin/env bash
# The one command run on the GPU machine: environment, the test suite, then the benchmark suite,
# ending with the benchmark's summary table.
#
#   scripts/gpu_check.sh [--quick] [--no-tests] [--sanitize] [--host-probe] [bench names...]
#
# --sanitize: after the tests, compute-sanitizer over every kernel (scripts/sanitize.py, logs in
# $OUT/sanitize/; it can also run alone, see its docstring).
# --host-probe: also run scripts/host_probe.py (the Python time of each op's eager call against
# torch's), its table into host.csv.
# With two GPUs or more the tests run on the first (CUDA_VISIBLE_DEVICES=0) while the benchmark runs
# on the second, at the same time; with one, one after the other.
# Wheels in .whl/ (e.g. liger-kernel, the peer the benchmark compares with) are installed into
# /tmp/site first, when that folder exists.
# Results go to $OUT (the device tool's output folder) when set, else to bench-results/:
# pytest.log, results.csv, <spec>.png (one per benchmark) and meta.json -- eight files at most for
# the full suite. Exit status: non-zero when the tests or the benchmark (a wrong or failed
# triton-workshop kernel) failed. Budget on an H100: the benchmark suite about 7.5 minutes,
# --quick about 2; the tests over 10 minutes in one process, 4.2 minutes with 12 pytest-xdist
# workers (1280 passed, 2026-11-24). So tests and the full benchmark need two calls of a 10-minute
# limit on one GPU: use --no-tests, --quick or PYTEST_ARGS="-k ..." (a selection). The suite
# grew to about 3,000 tests: with 20 workers it no longer finishes in 465 s beside a model
# benchmark on the other GPU (2026-11-27); give it a call of its own.
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
export PYTHONPATH=src PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl && export PYTHONPATH=src:/tmp/site
fi

PYTHON=${PYTHON:-$(command -v python3 || command -v python)}
RESULTS=${OUT:-bench-results}
mkdir -p "$RESULTS"

run_tests=1
run_sanitize=0
run_host_probe=0
PYTEST_ARGS=${PYTEST_ARGS:-}
bench_args=()
for arg in "$@"; do
    case "$arg" in
        --no-tests) run_tests=0 ;;
        --quick) bench_args+=(--quick) ;;
        --sanitize) run_sanitize=1 ;;
        --host-probe) run_host_probe=1 ;;
        -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
        *) bench_args+=("$arg") ;;
    esac
done

echo "== environment"
nvidia-smi -L || echo "nvidia-smi: not available"
"$PYTHON" - <<'EOF'
import torch, triton
try:
    import transformers; extra = f" · transformers {transformers.__version__}"
except ImportError:
    extra = " · transformers: not installed"
try:
    import liger_kernel; extra += " · liger-kernel installed"
except ImportError:
    extra += " · liger-kernel: not installed"
cuda = torch.cuda.is_available()
print(f"python {__import__('sys').version.split()[0]} · torch {torch.__version__} (CUDA {torch.version.cuda}) "
      f"· triton {triton.__version__} · GPU: {torch.cuda.get_device_name() if cuda else 'none'} x {torch.cuda.device_count()}{extra}")
EOF

n_gpus=$("$PYTHON" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
bench_gpu=()
[ "$n_gpus" -ge 2 ] && bench_gpu=(env CUDA_VISIBLE_DEVICES=1)

run_test_suite() {
    echo "== tests"
    local timeout_flag rc start
    timeout_flag=()
    if "$PYTHON" -c "import pytest_timeout" 2>/dev/null; then
        timeout_flag=(--timeout=300)
    fi
    # Compiling the kernels is most of the suite's time: spread it over worker processes where
    # pytest-xdist is installed (one process takes over 10 minutes on the GPU machine).
    if "$PYTHON" -c "import xdist" 2>/dev/null; then
        timeout_flag+=(-n "${PYTEST_WORKERS:-12}" --dist loadgroup)  # see tests/conftest.py
    fi
    start=$SECONDS
    # One config per autotuned kernel in the tests: correctness, not speed (bench tunes fully).
    # -v: each test's outcome and name as it finishes, so that a run cut off by the call's time
    # limit still names its failures (-rf's summary comes only at the end).
    # The big-memory tests (several GiB each) after the rest, alone: beside a dozen workers on
    # the same GPU they ran out of memory and took the other workers' tests down with them
    # (2026-11-27). Each failure's report goes to failures.log the moment it happens.
    export TRITON_WORKSHOP_FAILURE_LOG="$RESULTS/failures.log"
    rm -f "$TRITON_WORKSHOP_FAILURE_LOG"
    TRITON_WORKSHOP_AUTOTUNE=${TRITON_WORKSHOP_AUTOTUNE:-0} "$PYTHON" -m pytest tests -m "not big_memory" -v -p no:cacheprovider -rf --tb=short "${timeout_flag[@]}" $PYTEST_ARGS 2>&1 | tee "$RESULTS/pytest.log"
    rc=${PIPESTATUS[0]}
    "$PYTHON" -m pytest tests -m big_memory -v -p no:cacheprovider -rf --tb=short $PYTEST_ARGS 2>&1 | tee -a "$RESULTS/pytest.log"
    big_rc=${PIPESTATUS[0]}
    [ "$rc" = 0 ] && [ "$big_rc" != 0 ] && [ "$big_rc" != 5 ] && rc=$big_rc  # 5: none selected
    tests_status=$([ $rc = 0 ] && echo "passed" || echo "FAILED (exit $rc)")
    echo "tests: $tests_status in $((SECONDS - start)) s"
    echo "$tests_status" > "$RESULTS/.tests_status"
}

tests_status=skipped
tests_pid=
if [ "$run_tests" = 1 ]; then
    if [ "$n_gpus" -ge 2 ]; then
        echo "== tests on GPU 0, in the background (log: pytest.log); bench on GPU 1"
        CUDA_VISIBLE_DEVICES=0 run_test_suite > "$RESULTS/tests-console.log" 2>&1 &
        tests_pid=$!
    else
        run_test_suite
        tests_status=$(cat "$RESULTS/.tests_status")
    fi
fi

sanitize_status=skipped
if [ "$run_sanitize" = 1 ]; then
    echo "== compute-sanitizer"
    "$PYTHON" scripts/sanitize.py --out "$RESULTS/sanitize"
    sanitize_rc=$?
    sanitize_status=$([ $sanitize_rc = 0 ] && echo "clean" || echo "FAILED (exit $sanitize_rc)")
fi

echo "== bench ${bench_args[*]:-(full suite)}"
rm -f "$RESULTS/meta.json"  # so that a failed run cannot show an older summary below
start=$SECONDS
"${bench_gpu[@]}" "$PYTHON" -m triton_workshop.bench "${bench_args[@]}" --out "$RESULTS" 2>&1
bench_rc=$?
if [ "$run_host_probe" = 1 ]; then
    echo "== host time per eager call"
    "${bench_gpu[@]}" "$PYTHON" scripts/host_probe.py --csv "$RESULTS/host.csv" 2>&1 | tee "$RESULTS/host.log"
fi
if [ -n "$tests_pid" ]; then
    wait "$tests_pid"
    tests_status=$(cat "$RESULTS/.tests_status" 2>/dev/null || echo "FAILED (no status)")
    rm -f "$RESULTS/tests-console.log"
fi
rm -f "$RESULTS/.tests_status"
bench_status=$([ $bench_rc = 0 ] && echo "ok" || echo "FAILED (exit $bench_rc)")

echo
echo "== result: tests $tests_status · sanitizer $sanitize_status · bench $bench_status in $((SECONDS - start)) s · files in $RESULTS/"
if [ "$run_tests" = 1 ]; then
    tail -n 1 "$RESULTS/pytest.log"
fi
# The summary table last, where a truncated log still shows it.
"$PYTHON" - "$RESULTS/meta.json" <<'EOF' 2>/dev/null || true
import json, sys
print(json.load(open(sys.argv[1])).get("summary_table", ""), end="")
EOF

[ "$tests_status" != "passed" ] && [ "$tests_status" != "skipped" ] && exit 1
[ "$sanitize_status" != "clean" ] && [ "$sanitize_status" != "skipped" ] && exit 1
exit $bench_rc
