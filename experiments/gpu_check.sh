#!/usr/bin/env bash
# One prepared script for a lent GPU (planned for < 8 minutes on one H200-class GPU): the article-preset
# ladder, short (10 warm-up + 30 timed steps a rung, both frameworks, one repeat), the checkpointing and
# precision sweeps, a diagnosis, and the reports, all under one output folder.
#
#   experiments/gpu_check.sh [OUT]               # on the GPU: article preset
#   PRESET=tiny experiments/gpu_check.sh OUT     # on a CPU (slow, tiny): what CI runs so the script does not rot
#   DATA=path/to/cifar-100-python.tar.gz ...      # the real data set (default: a generated one, same format)
#
# Every run is its own process with a timeout, so one failure is recorded in its table and the rest go on.
set -euo pipefail

OUT=${1:-${OUT:-results/gpu-check}}
PRESET=${PRESET:-article}
PYTHON=${PYTHON:-python}
if [[ "$PRESET" == "article" ]]; then
    STEPS=${STEPS:-40}; TIMEOUT=${TIMEOUT:-300}
    CHECKPOINTING=${CHECKPOINTING:-"none 3,4 all"}; PRECISIONS=${PRECISIONS:-"fp32 bf16 fp16"}
    DIAGNOSE=(--model resnet50 --width 1 --batch-size 128 --compile compiled --steps 20 --timing-warmup 5)
else
    STEPS=${STEPS:-3}; TIMEOUT=${TIMEOUT:-600}
    CHECKPOINTING=${CHECKPOINTING:-"none all"}; PRECISIONS=${PRECISIONS:-"bf16"}
    DIAGNOSE=(--model resnet18 --width 0.125 --batch-size 16 --compile eager --steps 4 --timing-warmup 1)
fi
mkdir -p "$OUT"
started=$(date +%s)
stamp() { echo "[gpu_check +$(( $(date +%s) - started ))s] $*" | tee -a "$OUT/progress.log"; }
incomplete=0
# A ladder or sweep exits 1 when one of its runs failed (the row says why) and 2 on bad input: the script goes on
# to the next step either way, and ends with 1 if any step did not run everything it was asked for.
twinrun() {
    local code=0
    "$PYTHON" -m experiments "$@" || code=$?
    if (( code != 0 )); then stamp "twinrun $1 exited $code (recorded, going on)"; incomplete=1; fi
}

{ nvidia-smi || echo "no nvidia-smi: CPU run"; } > "$OUT/device.txt" 2>&1
"$PYTHON" -c "import torch, jax; print('torch', torch.__version__, torch.cuda.is_available()); print('jax', jax.__version__, jax.devices())" >> "$OUT/device.txt" 2>&1

data=()  # DATA: a CIFAR-100 archive or folder; default: a generated one in the official format
if [[ -n "${DATA:-}" ]]; then data=(--data "$DATA"); fi
common=(--preset "$PRESET" --steps "$STEPS" --repeats 1 --results "$OUT" --timeout "$TIMEOUT" "${data[@]}")
stamp "ladder ($PRESET, $STEPS steps a rung)"
twinrun ladder "${common[@]}" --name ladder
stamp "sweep checkpointing: $CHECKPOINTING"
# shellcheck disable=SC2086  # the value lists are meant to split into words
twinrun sweep checkpointing "${common[@]}" --name sweep-checkpointing --values $CHECKPOINTING
stamp "sweep precision: $PRECISIONS"
# shellcheck disable=SC2086
twinrun sweep precision "${common[@]}" --name sweep-precision --values $PRECISIONS
stamp "diagnose torch (${DIAGNOSE[*]})"
twinrun diagnose --framework torch --out "$OUT/diagnose" "${DIAGNOSE[@]}" "${data[@]}"
stamp "done; reports: $OUT/ladder/report.md $OUT/sweep-checkpointing/report.md $OUT/sweep-precision/report.md"
exit "$incomplete"
