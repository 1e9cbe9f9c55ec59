#!/usr/bin/env bash
# The fault matrix of docs/BENCHMARKS.md ("Diagnosis from evidence"): ppscope's own PP loop on
# 2 GPUs as a stand-in server, clean and with one fault each, every point profiled (per-rank
# Kineto traces + SGLang-format scheduler logs). Run from the repository root on a 2-GPU machine:
#   bash docs/runs/h200x2-faults/run_matrix.sh OUTDIR
# Each case leaves OUTDIR/<case>/{dispatch.json, traces/*.trace.json.gz, traces/*.log}; the
# diagnosis then reads only the traces, the logs and the run's tok/s (see diagnose_matrix.sh).
# The recorded cases in docs/ predate the probe's SGLang-shaped loop (docs/runs/h200x2/README.md,
# "Which probe"); this script runs today's probe.
set -u
OUT=${1:?usage: run_matrix.sh OUTDIR}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
COMMON=(--device cuda --pp 2 --work moe --layers-per-stage 2 --seconds 0.5 --profile)
run() {  # run CASE [extra dispatch flags...]
  local case=$1; shift
  mkdir -p "$OUT/$case"
  echo "== $case: $*" | tee -a "$OUT/matrix.log"
  timeout 240 $PY -m reports.cli dispatch "${COMMON[@]}" --trace-dir "$OUT/$case/traces" \
    --json "$OUT/$case/dispatch.json" "$@" >>"$OUT/matrix.log" 2>&1
  echo "   rc=$? $(date +%T)" | tee -a "$OUT/matrix.log"
}
# clean (even admission, graphs on) and the herd (SGLang's admission: a burst lands in one slot)
run base --policies even,sglang --concurrency 8,32
# the same clean points without the profiler: the tok/s a bench_serving run would give; the
# diagnosis of the profiled traces against it shows the profiler's CPU overhead and the
# report's CPU correction (diagnose_matrix.sh writes diag-*-noprof)
echo "== base without the profiler" | tee -a "$OUT/matrix.log"
timeout 240 $PY -m reports.cli dispatch --device cuda --pp 2 --work moe --layers-per-stage 2 --seconds 0.5 \
  --policies even,sglang --concurrency 8,32 --json "$OUT/base/dispatch_noprof.json" \
  >>"$OUT/matrix.log" 2>&1
run graphs-off --policies even --concurrency 8 --no-graphs
run slow-stage --policies even --concurrency 8 --inject slow-stage=1:1.5
run host-delay --policies even --concurrency 8 --inject host-delay=0:1000
run hop-delay --policies even --concurrency 8 --inject hop-delay=500
# faults the probe's switches do not make: another process on GPU 1, every CPU core busy
$PY docs/runs/gpu_matmul_load.py cuda:1 200 &
HOG=$!
sleep 5
run gpu1-shared --policies even --concurrency 8
kill $HOG 2>/dev/null; wait $HOG 2>/dev/null
PIDS=()
for _ in $(seq "$(nproc)"); do ( while :; do :; done ) & PIDS+=($!); done
run cpu-hog --policies even --concurrency 8
kill "${PIDS[@]}" 2>/dev/null
NCCL_P2P_DISABLE=1 run nop2p --policies even --concurrency 8
