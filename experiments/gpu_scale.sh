#!/usr/bin/env bash
# The data-scale study's GPU point, sourced by experiments/gpu_session.sh (its header has the calls, the schedule and
# the boxes): batched collection, the ce and kl arms side by side, evaluations, HumanEval, the summary. The functions
# use gpu_session.sh's settings and helpers (log, stage, STATE, RESULTS, PY, MODEL).

arm_override() {
    case $1 in
        ce) echo loss.ar_teacher=data ;;  # data_scale.py's ARMS
        kl) echo loss.ar_teacher=reference ;;
        *) echo "error: unknown arm $1" >&2; return 2 ;;
    esac
}

scale_eval() {  # scale_eval NAME MODEL OUT: TPF of ar, jacobi and mr on held-out code, math and training prompts
    stage "scale_eval_$1" "$4" "$PY" -m jf_jax.evaluate --model "$2" \
        --prompts "$SCALE/prompts/heldout_code.jsonl" --prompts "$SCALE/prompts/heldout_math.jsonl" \
        --train-prompts "$SCALE/prompts/train.jsonl" --limit "$EVAL_LIMIT" --methods ar,jacobi,mr \
        --block-size "$EVAL_BLOCKS" --max-new-tokens "$MAX_NEW" --dtype bfloat16 --out "$3"
}

scale_humaneval() {  # scale_humaneval NAME MODEL OUT: pass@1 of greedy AR answers, each executed against the problem's
    # tests; float32 with full-precision matmuls, as the CPU reference (results/studies/base_model_humaneval)
    JAX_DEFAULT_MATMUL_PRECISION=highest stage "scale_humaneval_$1" "$HE_S" "$PY" -m jf_jax.evaluate --model "$2" \
        --humaneval "$HUMANEVAL" --humaneval-max-new-tokens "$HE_MAX_NEW" --math-batch "$HE_BATCH" --methods ar \
        --dtype float32 --quality-dtype float32 --out "$3"
}

scale_counts() {  # prints "RESPONSES STEPS DIRS" and writes responses.json (data_scale.py's counting and steps)
    # shellcheck disable=SC2086  # TRAIN_OVERRIDES is a list of key=value words
    # on the CPU: a process that initialised the GPU would take 75% of its memory beside the evaluations
    # the collectors' directories, or the parts of trajectories carried from an earlier session (SCALE_TRAJ)
    local pattern=$SCALE/traj_w*
    if [ -n "${SCALE_TRAJ:-}" ]; then pattern=$SCALE_TRAJ/part-*; fi
    JAX_PLATFORMS=cpu "$PY" - "$SCALE" "$SCALE_OUT" "$SCALE_CONFIG" "$EPOCHS" "$pattern" $TRAIN_OVERRIDES <<'EOF'
import glob, json, os, sys

sys.path.insert(0, "experiments")
from data_scale import load_config, responses_in

scale, out, config, epochs, pattern = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), sys.argv[5]
overrides = sys.argv[6:]
dirs = []
for d in sorted(glob.glob(pattern)):
    manifest = os.path.join(d, "manifest.json")
    if os.path.exists(manifest) and json.load(open(manifest))["shards"]:
        dirs.append(d)
kept = responses_in(dirs) if dirs else 0
prompts = sum(s["prompt_end"] - s["prompt_start"] for d in dirs for s in json.load(open(os.path.join(d, "manifest.json")))["shards"])
batch = load_config(config, ["data.path=[unused]", *overrides]).data.batch_size
steps = max(1, round(epochs * kept / batch))
with open(os.path.join(scale, "counts.json"), "w") as f:
    json.dump(dict(prompts=prompts, responses=kept, batch_size=batch, epochs=epochs, steps=steps, dirs=dirs), f, indent=1)
with open(os.path.join(out, "responses.json"), "w") as f:  # the report's x axis; the evaluations are named by it
    json.dump({str(kept): kept}, f, indent=1)
print(kept, steps, ",".join(dirs) or "-")
EOF
}

scale_summary() {  # summary.txt from the counts, the manifests, the stage times and the runs' metrics
    # shellcheck disable=SC2086  # SCALE_ARMS is a list of words
    "$PY" - "$SCALE" "$SCALE_OUT" $SCALE_ARMS <<'EOF'
import glob, json, os, re, sys

scale, out, arms = sys.argv[1], sys.argv[2], sys.argv[3:]
counts = json.load(open(os.path.join(scale, "counts.json"))) if os.path.exists(os.path.join(scale, "counts.json")) else {}
stages = {}
for line in open(os.path.join(out, "logs", "stages.txt")) if os.path.exists(os.path.join(out, "logs", "stages.txt")) else []:
    name, *fields = line.split()
    stages[name] = dict(f.split("=") for f in fields)  # the last run of each stage
lines = [f"prompts collected: {counts.get('prompts')}; responses kept (repetition filter): {counts.get('responses')}"]
carried = [d for d in counts.get("dirs", []) if os.path.basename(d).startswith("part-")]
if carried:  # collected in an earlier session: its own summary tells how
    lines.append(f"trajectories carried from an earlier collection: {len(carried)} parts ({os.path.dirname(carried[0])})")
for d in counts.get("dirs", []):
    w = os.path.basename(d)
    if d in carried:
        continue
    m = json.load(open(os.path.join(d, "manifest.json")))
    shards = m["shards"]
    kept = sum(s["prompt_end"] - s["prompt_start"] - s["num_filtered"] for s in shards)
    mism = sum(s.get("num_mismatched", 0) for s in shards)
    st = stages.get(f"scale_collect_{w.split('_')[-1]}", {})
    times = [os.path.getmtime(os.path.join(d, s["file"])) for s in shards]
    steady = ""
    if len(shards) > 1 and times[-1] > times[0]:  # after the first shard (loading, compilation)
        later = sum(s["prompt_end"] - s["prompt_start"] - s["num_filtered"] for s in shards[1:])
        steady = f"; after the first shard {later / (times[-1] - times[0]):.2f} responses/s"
    secs = float(st.get("seconds", "nan"))
    lines.append(f"{w}: {len(shards)} shards, prompts {shards[0]['prompt_start']}-{shards[-1]['prompt_end']} of its "
                 f"{m['num_prompts']}, kept {kept}, mismatched {mism}; stage {secs:.0f} s (rc {st.get('rc')}, box "
                 f"{st.get('box')}), {kept / secs if secs == secs and secs else float('nan'):.2f} responses/s{steady}")
    with open(os.path.join(out, f"manifest_{w}.json"), "w") as f:
        json.dump(m, f, indent=1)
if counts.get("dirs") and not carried:
    secs = max(float(stages.get(f"scale_collect_{os.path.basename(d).split('_')[-1]}", {}).get("seconds", "nan"))
               for d in counts["dirs"])
    lines.append(f"collection: {secs:.0f} s wall (model loading and compilation included), "
                 f"{counts['responses'] / secs:.2f} responses/s together")
lines.append(f"training: {counts.get('steps')} steps planned per arm ({counts.get('epochs')} epochs of "
             f"{counts.get('responses')} responses at batch {counts.get('batch_size')})")
for arm in arms:
    run = os.path.join(scale, arm)
    rows = [json.loads(l) for l in open(os.path.join(run, "metrics.jsonl"))] if os.path.exists(os.path.join(run, "metrics.jsonl")) else []
    log = os.path.join(out, "logs", f"scale_train_{arm}.log")
    text = open(log).read() if os.path.exists(log) else ""
    seqs = re.findall(r"\d+ training sequences; \d+ \([\d.]+%\) longer than[^\n]*", text)
    rate = re.findall(r"[\d.]+ steps/s since the first", text)
    st = stages.get(f"scale_train_{arm}", {})
    last = rows[-1] if rows else {}
    lines.append(f"{arm}: step {last.get('step', 0)} of {counts.get('steps')}, final loss/total "
                 f"{last.get('loss/total', float('nan')):.4f}; {rate[-1] if rate else 'no rate logged'}; stage "
                 f"{st.get('seconds')} s (rc {st.get('rc')}, box {st.get('box')}); exported: "
                 f"{os.path.isdir(os.path.join(run, 'params'))}; {seqs[0] if seqs else ''}")
for name, st in stages.items():
    if "eval" in name or "humaneval" in name:
        lines.append(f"{name}: rc {st.get('rc')} after {st.get('seconds')} s (box {st.get('box')})")
for path in sorted(glob.glob(os.path.join(out, "humaneval_*.json"))):
    h = json.load(open(path))["results"][0].get("humaneval") or {}
    nll = (json.load(open(path))["results"][0].get("humaneval_nll") or {}).get("nll_per_token")
    lines.append(f"{os.path.basename(path)}: pass@1 {h.get('pass_at_1')} ({h.get('passed')} of {h.get('problems')}), "
                 f"solution NLL {nll}")
text = "\n".join(lines) + "\n"
open(os.path.join(out, "summary.txt"), "w").write(text)
print(text, end="")
EOF
}

scale_pipeline() {
    trap 'log "pipeline finished (rc $?)"' EXIT  # what wait_for looks for, also after an error
    local STAGE_LOGS=$SCALE_OUT/logs  # stage() writes each log, and stages.txt, there
    mkdir -p "$SCALE/prompts" "$STAGE_LOGS"
    local f
    for f in train heldout_code heldout_math; do  # a copy: the calls after the second do not carry the pool
        [ -s "$SCALE/prompts/$f.jsonl" ] || cp "$SCALE_PROMPTS/$f.jsonl" "$SCALE/prompts/"
    done
    log "scale pipeline: deadline ${SCALE_DEADLINE_S}s; collect ${SCALE_COLLECT_S}s, train ${SCALE_TRAIN_S}, evaluate" \
        "${SCALE_EVAL_S}s (base ${SCALE_EVAL_BASE_S}s), HumanEval ${HE_S}s ($HUMANEVAL problems)"

    # a. collection (or the wait for trajectories that a later call carries), and beside it the base model's
    # evaluations (which may run on into training)
    local total per i limit pids=() base_pids=()
    total=$(wc -l <"$SCALE/prompts/train.jsonl")
    if [ "$SCALE_LIMIT" -lt "$total" ]; then total=$SCALE_LIMIT; fi
    per=$(((total + SCALE_WORKERS - 1) / SCALE_WORKERS))
    if [ "$EVAL_BASE" = 1 ]; then
        XLA_PYTHON_CLIENT_MEM_FRACTION=$MEM_EVAL scale_eval base "$MODEL" "$SCALE_OUT/eval_base_0" "$SCALE_EVAL_BASE_S" &
        base_pids+=($!)
    fi
    if [ "$HUMANEVAL" -gt 0 ] && [ "$HE_BASE" = 1 ]; then
        XLA_PYTHON_CLIENT_MEM_FRACTION=$MEM_HE scale_humaneval base "$MODEL" "$SCALE_OUT/humaneval_base_0" &
        base_pids+=($!)
    fi
    if [ -n "${SCALE_TRAJ:-}" ]; then  # no collection: stash_traj marks the carried parts complete
        log "waiting for the carried trajectories in $SCALE_TRAJ"
        until [ -f "$SCALE_TRAJ/complete" ] || [ $SECONDS -gt $((SCALE_DEADLINE_S / 2)) ]; do sleep 2; done
        SCALE_WORKERS=0
    fi
    for ((i = 0; i < SCALE_WORKERS; i++)); do
        limit=$((total - i * per < per ? total - i * per : per))
        if [ $limit -le 0 ]; then break; fi
        XLA_PYTHON_CLIENT_MEM_FRACTION=$MEM_COLLECT stage "scale_collect_w$i" "$SCALE_COLLECT_S" "$PY" -m jf_jax.collect \
            --model "$MODEL" --prompts "$SCALE/prompts/train.jsonl" --offset $((i * per)) --limit $limit \
            --out "$SCALE/traj_w$i" --batch-size "$BATCH" --prompts-per-shard "$BATCH" --max-new-tokens "$MAX_NEW" \
            --block-size 16 --dtype bfloat16 --repetition-filter --no-progress &
        pids+=($!)
    done
    for i in "${pids[@]}"; do wait "$i" || true; done  # (none when the trajectories were carried)

    local counts n steps dirs
    counts=$(scale_counts 2>>"$STAGE_LOGS/counts.log" | tail -n 1) || { log "error: counting the responses failed" \
        "($STAGE_LOGS/counts.log)"; counts="0 0 -"; }
    read -r n steps dirs <<<"$counts"
    log "collected: $n responses kept in ${dirs//,/ }; $steps training steps per arm"

    # b. both arms side by side
    local arm train_s pids=()
    if [ "$n" -gt 0 ]; then
        train_s=$SCALE_TRAIN_S
        if [ "$train_s" = auto ]; then
            train_s=$((SCALE_DEADLINE_S - SECONDS - SCALE_EVAL_S - 20))
            train_s=$((train_s < 120 ? 120 : train_s > 600 ? 600 : train_s))
        fi
        local stop_s=$((train_s - TRAIN_TAIL_S < 60 ? 60 : train_s - TRAIN_TAIL_S))
        log "training: box ${train_s}s each, stopping after ${stop_s}s of steps"
        for arm in $SCALE_ARMS; do
            # shellcheck disable=SC2086  # TRAIN_OVERRIDES is a list of key=value words
            XLA_PYTHON_CLIENT_MEM_FRACTION=$MEM_TRAIN stage "scale_train_$arm" $((train_s + 30)) "$PY" -m jf_jax.train \
                "$SCALE_CONFIG" --run-dir "$SCALE/$arm" "data.path=[$dirs]" "$(arm_override "$arm")" \
                "train.steps=$steps" "run_name=data_scale_gpu_${arm}_$n" $TRAIN_OVERRIDES \
                --stop-after-minutes "$(awk "BEGIN {print $stop_s / 60}")" --export-on-stop --no-progress \
                --log-every-s 30 &
            pids+=($!)
        done
        for i in "${pids[@]}"; do wait "$i" || true; done
        for arm in $SCALE_ARMS; do
            for f in config.yaml metrics.jsonl loss_curve.png; do
                if [ -f "$SCALE/$arm/$f" ]; then cp "$SCALE/$arm/$f" "$SCALE_OUT/${arm}_$f"; fi
            done
        done
    else
        log "error: no responses collected: no training (see $STAGE_LOGS/scale_collect_w*.log)"
    fi

    # c. the arms' evaluations side by side, then their HumanEval side by side: at HE_BATCH 41 its float32 prefill
    # program takes about 21 GiB, more than it gets beside the evaluations
    local evaluated=()
    pids=()
    for arm in $SCALE_ARMS; do
        if [ ! -d "$SCALE/$arm/params" ]; then log "$arm: no exported weights, not evaluated"; continue; fi
        evaluated+=("$arm")
        XLA_PYTHON_CLIENT_MEM_FRACTION=$MEM_EVAL_ARM scale_eval "$arm" "$SCALE/$arm" "$SCALE_OUT/eval_${arm}_$n" \
            "$SCALE_EVAL_S" &
        pids+=($!)
    done
    for i in "${pids[@]}"; do wait "$i" || true; done
    pids=()
    if [ "$HUMANEVAL" -gt 0 ]; then
        for arm in "${evaluated[@]}"; do
            XLA_PYTHON_CLIENT_MEM_FRACTION=$MEM_HE_ARM scale_humaneval "$arm" "$SCALE/$arm" \
                "$SCALE_OUT/humaneval_${arm}_$n" &
            pids+=($!)
        done
    fi
    for i in "${pids[@]}" "${base_pids[@]}"; do wait "$i" || true; done

    # d. the summary and the curve of what is there
    scale_summary || log "error: the summary failed"
    JAX_PLATFORMS=cpu timeout 120 "$PY" experiments/data_scale_report.py "$SCALE_OUT" >"$STAGE_LOGS/report.log" 2>&1 ||
        log "data_scale_report.py failed (see logs/report.log)"
}

# The CPU learning curve's data, collected on the device (CURVE_* settings): data_scale.py's parts of 250 prompts
# (`--preset cpu`, so the CPU run trains on them as if it had collected them), CURVE_WORKERS processes each taking
# every N-th part with the batched recorder at BATCH rows, in a box of $1 seconds (a part cut by the box keeps its
# complete shards and resumes). `curve_pack` brings the parts back: a prefix of them, as many as fit in the 64 MiB
# a call returns, as pieces of one tarball (in the repository root: cat curve.tar.* | tar x -C runs/data_scale).
CURVE_RUNS=$STATE/curve
CURVE_PROMPTS=${CURVE_PROMPTS:-6000}
CURVE_WORKERS=${CURVE_WORKERS:-2}
CURVE_RETURN_MIB=${CURVE_RETURN_MIB:-56}

curve_collect() {
    local box=${1:-300} i pids=()
    mkdir -p "$RESULTS/curve_logs"
    log "curve collection: $CURVE_WORKERS workers, ${CURVE_PROMPTS} prompts at batch $BATCH, box ${box}s"
    set -m  # background jobs keep SIGINT (see collect_workers), so the box's INT reaches each worker
    for ((i = 0; i < CURVE_WORKERS; i++)); do
        XLA_PYTHON_CLIENT_MEM_FRACTION=$(awk "BEGIN {print 0.9 / $CURVE_WORKERS}") timeout --signal=INT \
            --kill-after=20 "$box" "$PY" experiments/data_scale.py --preset cpu --sizes "$CURVE_PROMPTS" \
            --stages collect --collect-batch "$BATCH" --worker "$i/$CURVE_WORKERS" --prompt-dir "$SCALE_PROMPTS" \
            --runs "$CURVE_RUNS" >"$RESULTS/curve_logs/worker$i.log" 2>&1 &
        pids+=($!)
    done
    for i in "${pids[@]}"; do wait "$i" || true; done
    curve_summary | tee "$RESULTS/curve_summary.txt"
}

curve_summary() {  # per part: prompts done, responses kept, mismatched blocks, and when its shards were written
    "$PY" - "$CURVE_RUNS/trajectories_n16" <<'PYEOF'
import glob, json, os, sys

rows, times = [], []
for d in sorted(glob.glob(os.path.join(sys.argv[1], "part-*"))):
    m = json.load(open(os.path.join(d, "manifest.json"))) if os.path.exists(os.path.join(d, "manifest.json")) else None
    if not m or not m["shards"]:
        continue
    s = m["shards"]
    prompts = s[-1]["prompt_end"] - s[0]["prompt_start"]
    kept = prompts - sum(x["num_filtered"] for x in s)
    times += [os.path.getmtime(os.path.join(d, x["file"])) for x in s]
    rows.append((os.path.basename(d), prompts, m["num_prompts"], kept, sum(x.get("num_mismatched", 0) for x in s),
                 sum(x["num_records"] for x in s), m["metadata"].get("decode_shape")))
for r in rows:
    print("%s: %d of %d prompts, %d responses kept, %d mismatched, %d block records, decode shape %s" % r)
kept = sum(r[3] for r in rows)
print(f"total: {sum(r[1] for r in rows)} prompts, {kept} responses kept, {sum(r[4] for r in rows)} mismatched")
if len(times) > 1:
    print(f"first to last shard: {max(times) - min(times):.0f} s")
PYEOF
}

curve_pack() {
    local dir=$CURVE_RUNS/trajectories_n16 budget=$((CURVE_RETURN_MIB * 1048576)) used=0 size part list=()
    for part in "$dir"/part-*; do  # a prefix of parts (the curve's sizes are prefixes), ending at the first unfinished
        [ -f "$part/manifest.json" ] || break
        size=$(du -sb "$part" | cut -f1)
        if [ $((used + size)) -gt $budget ]; then break; fi
        used=$((used + size)) && list+=("trajectories_n16/$(basename "$part")")
        "$PY" -c "import json, sys; m = json.load(open(sys.argv[1])); s = m['shards']
sys.exit(0 if s and s[-1]['prompt_end'] == m['num_prompts'] else 1)" "$part/manifest.json" || break
    done
    log "curve_pack: ${#list[@]} parts, $(mib $used) MiB"
    if [ ${#list[@]} -gt 0 ]; then
        tar cf - -C "$CURVE_RUNS" "${list[@]}" | split -b 15m -d -a 1 - "${OUT:?}/curve.tar."
    fi
    ls -la "$OUT"
}
