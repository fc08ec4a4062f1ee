#!/usr/bin/env bash
# One prepared script for a lent GPU (planned for ~11 minutes on one H200-class GPU, 13.5 at worst): the
# article-preset ladder, short (10 warm-up + 30 timed steps a rung, both frameworks, one repeat) with its ablations
# (top rung minus each technique) and recommendation; a short time-to-accuracy ladder (the cpu preset's small ResNet:
# baseline and + compile, whole epochs to a modest target, 2 seeds, accuracy verdict and learning curves); the
# checkpointing sweep; a diagnosis; the ViT twin's checkpointing and attention-kernel sweeps; and the reports, all
# under one output folder. (The precision sweep left: the ladder's amp rung and its "top minus amp" ablation measure
# the dtypes in both frameworks.)
#
# How the minutes were estimated (H200 host, 16 cores; no GPU was lent to measure it): a process start with CUDA
# and a framework ~8 s; torch.compile of a ResNet-50 train step ~35 s cold, ~10 s from a warm cache; jax.jit ~15 s;
# JAX eager's first step (each primitive compiled) ~10 s; a step 20-60 ms. Ladder: 16 runs x 8 s + torch compiled
# 2 cold x 35 s + 2 warm x 10 s + JAX 4 x 15 s + JAX eager 4 x 10 s + 16 x 40 steps x 0.05 s = ~5.5 min. Accuracy
# ladder (ResNet-18 width 0.125): 8 runs x 8 s + ~40 s of compiles + 8 x 2 epochs x 78 steps x 10 ms = ~2 min.
# Checkpointing sweep (4 runs) ~1 min, diagnosis ~1 min: ~9.5 min at worst, ~7 with the faster starts.
# ViT sweeps (vit-s, batch 128, AdamW, 40 steps; torch eager, JAX jit): checkpointing none / attention / all and
# attention naive / fused, 10 runs: 10 x 8 s starts + JAX 5 x ~20 s jit of 12 blocks (remat and the naive kernel
# each compile their own program) + 10 x 40 steps x ~40 ms (~1.1 TFLOP a step in fp32) + the shared initial weights
# and 2 matmul rates ~30 s = ~4 min at worst, ~3 with the faster starts.
# TIME_TO_ACCURACY=0 leaves the accuracy ladder out, VIT=0 the ViT sweeps, TEXT=1 adds the text shapes sweep (opt-in
# on the GPU: see below); every run has a timeout, so a hang
# costs that and no more.
#
#   experiments/gpu_check.sh [OUT]               # on the GPU: article preset
#   PRESET=tiny experiments/gpu_check.sh OUT     # on a CPU (slow, tiny): what CI runs so the script does not rot
#   DATA=path/to/cifar-100-python.tar.gz ...      # the real data set (default: a generated one, same format)
#   VIT_MODEL=vit-tiny ...                        # a smaller ViT for the ViT sweeps (default vit-s; tiny: vit-micro)
#   LADDER_RUNGS=amp,compile ...                  # the ladder's techniques (default: all; tiny: compile)
#   SWEEP_FRAMEWORK=torch ...                     # the checkpointing sweep's framework(s) (default both; tiny: torch)
#   TORCHCOMPILE_BACKEND=aot_eager ...            # torch.compile's backend in the ladder and text sweep (inductor)
#   CONTROL=0 ...                                 # no A/A control in the ladders and sweeps (0 only; default 1; tiny: 0)
#
# Every run is its own process with a timeout, so one failure is recorded in its table and the rest go on.
set -euo pipefail

OUT=${1:-${OUT:-results/gpu-check}}
PRESET=${PRESET:-article}
PYTHON=${PYTHON:-python}
if [[ "$PRESET" == "article" ]]; then
    STEPS=${STEPS:-40}; TIMEOUT=${TIMEOUT:-300}
    CHECKPOINTING=${CHECKPOINTING:-"none all"}
    DIAGNOSE=(--model resnet50 --width 1 --batch-size 128 --compile compiled --steps 20 --timing-warmup 5)
    ACCURACY=(--preset cpu --rungs compile --no-ablations --to-accuracy "${TARGET:-0.3}" --epochs 2 --repeats 2)
    ABLATIONS=--ablations; LADDER_RUNGS=${LADDER_RUNGS:-}; SWEEP_FRAMEWORK=${SWEEP_FRAMEWORK:-both}
    # the ViT twin on the same preset (batch 128, 40 steps); the checkpointing sweep's values leave out its
    # "first half of the blocks" (the default adds it) to keep the script's minutes
    VIT_MODEL=${VIT_MODEL:-vit-s}; VIT_STEPS=${VIT_STEPS:-$STEPS}; VIT_FRAMEWORK=${VIT_FRAMEWORK:-both}
    VIT_CHECKPOINTING=${VIT_CHECKPOINTING:-"none attention all"}; VIT_ATTENTION=${VIT_ATTENTION:-"naive fused"}
    # the text shapes study is opt-in here (TEXT=1, ~4.5 more minutes, estimated: 6 torch.compile graphs of
    # text-tiny ~25 s each, 3 JAX runs, 7 process starts, one epoch of the generated 2,000 texts at batch 128 each)
    TEXT=${TEXT:-0}; TEXT_MODEL=${TEXT_MODEL:-text-tiny}; TEXT_FRAMEWORK=${TEXT_FRAMEWORK:-both}
    TEXT_SHAPES=${TEXT_SHAPES:-"pad-max pad-longest pad-longest:mark bucket"}
    TORCHCOMPILE_BACKEND=${TORCHCOMPILE_BACKEND:-inductor}
    CONTROL=${CONTROL:-1}
else
    STEPS=${STEPS:-3}; TIMEOUT=${TIMEOUT:-600}
    CHECKPOINTING=${CHECKPOINTING:-"none all"}
    DIAGNOSE=(--model resnet10 --width 0.125 --batch-size 16 --compile eager --steps 4 --timing-warmup 1)
    # CI's CPU: the ablations are left out of the tiny ladder (tests/test_ladder_answers.py checks them on planted
    # rows); the accuracy ladder keeps 2 seeds so that the verdict has a spread, in torch only: JAX's baseline rung
    # is eager, op by op, and its 8 runs cost the suite ~150 s (tests/test_loop.py runs JAX to a target)
    # The accuracy ladder's rung is flags (no effect on a CPU, so nothing but the planted LR decides its verdict):
    # torch's bf16 is emulated on a CPU without avx512_bf16 or AMX, and its runs of whole epochs cost the most here
    ACCURACY=(--rungs flags --no-ablations --to-accuracy "${TARGET:-0.03}" --epochs 2 --repeats 2
              --framework "${ACCURACY_FRAMEWORK:-torch}")
    ABLATIONS=--no-ablations
    # CI's CPU: a ladder of one technique, compile (jax.jit and torch.compile: what a GPU run most needs to work),
    # so that JAX runs op by op once, not three times (an amp rung cost the suite ~40 s: JAX's bf16 op by op); the
    # loader and flags rungs run end to end in tests/test_ladder.py (the resumed ladder: torch; the flags verdict:
    # both frameworks), amp's dtypes in tests/test_trainers.py (both frameworks' bf16 and fp16 against fp32) and the
    # ladder's plan of every rung in tests/test_ladder_answers.py. The checkpointing sweep: torch
    # (tests/test_trainers.py measures both frameworks' saved activations, end to end in each trainer).
    LADDER_RUNGS=${LADDER_RUNGS:-compile}; SWEEP_FRAMEWORK=${SWEEP_FRAMEWORK:-torch}
    # CI's CPU: one run per ViT sweep (torch, 2 steps of vit-micro), so that the ViT step costs the test ~15 s;
    # tests/test_vit_driver.py plans the ViT ladder and sweeps in both frameworks and runs its infer and overhead
    VIT_MODEL=${VIT_MODEL:-vit-micro}; VIT_STEPS=${VIT_STEPS:-2}; VIT_FRAMEWORK=${VIT_FRAMEWORK:-torch}
    VIT_CHECKPOINTING=${VIT_CHECKPOINTING:-attention}; VIT_ATTENTION=${VIT_ATTENTION:-naive}
    # CI's CPU: inductor, as on the GPU (its cold compile of the tiny ResNet's step is ~80 s of the ladder's ~160
    # in the suite here): the suite's test of this script holds the compile rung's losses to the baseline rung's, the
    # suite's one check of inductor's code on that step. TORCHCOMPILE_BACKEND=aot_eager runs dynamo's graphs with
    # eager kernels.
    TORCHCOMPILE_BACKEND=${TORCHCOMPILE_BACKEND:-inductor}
    # CI's CPU: the shapes sweep's two JAX runs (torch's, even through aot_eager, took 45 s against JAX's 36 here:
    # dynamo traces the encoder's whole update, ~4-5 s a graph; tests/test_text_trainers.py counts torch's graphs);
    # TEXT_DATA: a small text set, one epoch each (TORCHCOMPILE_BACKEND reaches its torch runs, with TEXT_FRAMEWORK
    # torch or both)
    TEXT=${TEXT:-1}; TEXT_MODEL=${TEXT_MODEL:-text-micro}; TEXT_FRAMEWORK=${TEXT_FRAMEWORK:-jax}
    TEXT_SHAPES=${TEXT_SHAPES:-"pad-max bucket"}
    # CI's CPU: no A/A control (the reference run once more per framework, repeat and command: 8 runs, ~45 s of the
    # test alone here); the tiny preset's timings decide nothing, and the suite runs the control end to end in
    # tests/test_ladder.py (the resumed ladder, the serial sweep), tests/test_scaling.py and on planted rows in
    # tests/test_stats.py. CONTROL=1 keeps it.
    CONTROL=${CONTROL:-0}
fi
control=()  # CONTROL=0: --no-control for every ladder and sweep
if [[ "$CONTROL" == 0 ]]; then control=(--no-control); fi
# a test hook: extra flags for the accuracy ladder (the suite breaks one rung's LR, a planted accuracy drop)
read -r -a ACCURACY_EXTRA <<< "${ACCURACY_EXTRA:-}"
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
common=(--preset "$PRESET" --repeats 1 --results "$OUT" --timeout "$TIMEOUT" "${data[@]}" "${control[@]}")
stamp "ladder ($PRESET, $STEPS steps a rung)"
rungs=()  # LADDER_RUNGS: the techniques of the ladder's rungs (default: every technique, in the default order)
if [[ -n "$LADDER_RUNGS" ]]; then rungs=(--rungs "$LADDER_RUNGS"); fi
twinrun ladder "${common[@]}" --steps "$STEPS" --name ladder "$ABLATIONS" "${rungs[@]}" \
    --torchcompile-backend "$TORCHCOMPILE_BACKEND"
if [[ "${TIME_TO_ACCURACY:-1}" != 0 ]]; then
    stamp "time-to-accuracy ladder (${ACCURACY[*]})"
    twinrun ladder "${common[@]}" --name ladder-accuracy "${ACCURACY[@]}" "${ACCURACY_EXTRA[@]}"
fi
stamp "sweep checkpointing: $CHECKPOINTING"
# shellcheck disable=SC2086  # the value lists are meant to split into words
twinrun sweep checkpointing "${common[@]}" --steps "$STEPS" --name sweep-checkpointing --values $CHECKPOINTING \
    --framework "$SWEEP_FRAMEWORK"
stamp "diagnose torch (${DIAGNOSE[*]})"
twinrun diagnose --framework torch --out "$OUT/diagnose" "${DIAGNOSE[@]}" "${data[@]}"
if [[ "${VIT:-1}" != 0 ]]; then
    # The ViT twin through the same commands (the preset adapts to its family: AdamW, lr 1e-3). Its own --results
    # folder: its initial weights and matmul rate apart from the ResNet's.
    vit=(--preset "$PRESET" --model "$VIT_MODEL" --steps "$VIT_STEPS" --framework "$VIT_FRAMEWORK" --repeats 1
         --results "$OUT/vit" --timeout "$TIMEOUT" "${data[@]}" "${control[@]}")
    stamp "ViT ($VIT_MODEL) sweep checkpointing: $VIT_CHECKPOINTING; sweep attention: $VIT_ATTENTION"
    # shellcheck disable=SC2086  # the value lists are meant to split into words
    twinrun sweep checkpointing "${vit[@]}" --name sweep-checkpointing --values $VIT_CHECKPOINTING
    # shellcheck disable=SC2086
    twinrun sweep attention "${vit[@]}" --name sweep-attention --values $VIT_ATTENTION
fi
if [[ "$TEXT" != 0 ]]; then
    # Variable-length text: batching x compile strategy, one epoch each (TEXT_DATA: a folder of AG News CSVs or
    # JSON Lines; default: the generated 2,000 texts)
    text_data=()
    if [[ -n "${TEXT_DATA:-}" ]]; then text_data=(--data "$TEXT_DATA"); fi
    stamp "text ($TEXT_MODEL) sweep shapes: $TEXT_SHAPES"
    # shellcheck disable=SC2086
    twinrun sweep shapes --preset "$PRESET" --model "$TEXT_MODEL" --framework "$TEXT_FRAMEWORK" --repeats 1 \
        --results "$OUT/text" --timeout "$TIMEOUT" --name sweep-shapes --values $TEXT_SHAPES "${text_data[@]}" \
        --torchcompile-backend "$TORCHCOMPILE_BACKEND" "${control[@]}"
fi
stamp "done; reports: $OUT/ladder/report.md $OUT/ladder-accuracy/report.md $OUT/sweep-checkpointing/report.md" \
      "$OUT/vit/sweep-checkpointing/report.md $OUT/vit/sweep-attention/report.md $OUT/text/sweep-shapes/report.md"
exit "$incomplete"
