#!/usr/bin/env bash
# Runs, on a GPU host, every GPU test and benchmark of a bundle made by
#   cmake -S . -B build-gpu -G Ninja -DTS_ENABLE_CUDA=ON -DTS_CUDA_ARCHS=90 && cmake --build build-gpu
#   ../shared/scripts/gpu-bundle.sh .gpu build-gpu/bin/gpu_*_test build-gpu/bin/bench_*
# (docs/gpu.md). Logs go to $OUT (or ./gpu-suite-out); a summary table is printed last.
#   scripts/gpu-suite.sh [tests|bench|all]   (default all)
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu-suite-out}
mkdir -p "$out"
what=${1:-all}
summary=()
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv \
  | tee "$out/gpu.txt"

if [[ $what == all || $what == tests ]]; then
  # ptxas 13.0 can give an L2 cache policy's memory descriptor an odd uniform register (seen on
  # cp.async in key_scores_mma.cu's prologue: docs/kernel_tuning_log.md, thirty-second session),
  # which faults as an illegal instruction at run time. Every binary's SASS is searched for one.
  cuobjdump=$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)
  if [[ -x $cuobjdump ]]; then
    odd=0
    for b in .gpu/bin/*; do
      n=$("$cuobjdump" -sass "$b" 2>/dev/null | grep -cE 'desc\[UR[0-9]*[13579]\]')
      if (( n > 0 )); then echo "$(basename "$b"): $n odd descriptor registers"; fi
      odd=$((odd + n))
    done
    if (( odd == 0 )); then
      summary+=("PASS  SASS: no memory descriptor in an odd uniform register")
    else
      summary+=("FAIL  SASS: $odd memory descriptors in odd uniform registers (above)")
    fi
  else
    summary+=("skip  SASS check: no cuobjdump")
  fi
  for t in .gpu/bin/gpu_*_test; do
    name=$(basename "$t")
    if .gpu/run "$name" > "$out/$name.log" 2>&1; then
      summary+=("PASS  $name  $(grep -E '^\[  PASSED  \]' "$out/$name.log")")
    else
      summary+=("FAIL  $name  (see $name.log)")
      tail -30 "$out/$name.log"
    fi
  done
fi
if [[ $what == all || $what == bench ]]; then
  for b in .gpu/bin/bench_*; do
    name=$(basename "$b")
    [[ $name == bench_fidelity || $name == bench_load ]] && continue
    echo "== $name"
    .gpu/run "$name" 2>&1 | tee "$out/$name.log" | tail -25
    summary+=("ran   $name  (exit ${PIPESTATUS[0]})")
  done
  if [[ -f bench/torch_peers.py ]]; then
    echo "== torch_peers.py"
    python3 bench/torch_peers.py 2>&1 | tee "$out/torch_peers.log" | tail -25
    summary+=("ran   torch_peers.py")
  fi
fi
echo
printf '%s\n' "${summary[@]}"
