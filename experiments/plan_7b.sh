#!/usr/bin/env bash
# The plan_7b study (results/studies/plan_7b/README.md): `jf-jax plan` for Qwen2.5-7B Jacobi Forcing training and
# decoding on TPU and GPU slices, one process per plan (each with as many simulated CPU devices as its meshes need),
# one after the other. Writes OUT/NAME.json, OUT/NAME.log (the printed plan, stderr, exit status and wall seconds).
#
#     bash experiments/plan_7b.sh results/studies/plan_7b        # every plan
#     bash experiments/plan_7b.sh results/studies/plan_7b h200_1  # the plans whose name starts with h200_1
#     python experiments/plan_7b_table.py results/studies/plan_7b # the README's tables from the JSONs
set -u
OUT=${1:?usage: plan_7b.sh OUT [NAME_PREFIX]}
ONLY=${2:-}
mkdir -p "$OUT"

# The reference's packing: 8 rows a step of 2,048 tokens (a 256-token prompt, then 56 noisy/clean block pairs of
# 16), the reference over the prompt and the clean half (1,152 tokens), remat, the recipe's loss; collection with
# Jacobi blocks of 16 over ~1,024 cached slots, 8 rows per model replica.
TRAIN=(--model qwen2.5-7b --seq-len 2048 --batch 8 --prompt-len 256 --remat --teacher reference)
COLLECT=(--block-size 16 --context 1024)

plan() {  # plan NAME DEVICES ARGS...: one plan in its own process
    local name=$1 devices=$2
    shift 2
    [[ -n "$ONLY" && "$name" != "$ONLY"* ]] && return 0
    local start=$SECONDS
    XLA_FLAGS=--xla_force_host_platform_device_count=$devices python -m jf_jax.plan "$@" --json "$OUT/$name.json" \
        > "$OUT/$name.log" 2>&1
    local code=$?
    echo "exit status $code, $((SECONDS - start)) s wall: python -m jf_jax.plan $* --json $OUT/$name.json" \
        >> "$OUT/$name.log"
    echo "$name: exit $code, $((SECONDS - start)) s"
}

# Training, and a round's collection on the same slice (8 rows per replica of the decode mesh).
plan v5p8_fsdp4 4 "${TRAIN[@]}" --target v5p --mesh fsdp=4 --decode-mesh data=4 --decode-batch 32 "${COLLECT[@]}"
plan v5p8_fsdp2_tensor2 4 "${TRAIN[@]}" --target v5p --mesh fsdp=2,tensor=2 --decode-mesh data=4 --decode-batch 32 \
    "${COLLECT[@]}"
for target in v6e h100 h200; do
    plan "${target}x8_fsdp8" 8 "${TRAIN[@]}" --target $target --mesh fsdp=8 --decode-mesh data=8 --decode-batch 64 \
        "${COLLECT[@]}"
    plan "${target}x8_fsdp4_tensor2" 8 "${TRAIN[@]}" --target $target --mesh fsdp=4,tensor=2 --decode-mesh data=8 \
        --decode-batch 64 "${COLLECT[@]}"
done
plan v5e8_fsdp8 8 "${TRAIN[@]}" --target v5e --mesh fsdp=8 --decode-mesh data=2,tensor=4 --decode-batch 16 \
    "${COLLECT[@]}"
plan v5e16_fsdp8_tensor2 16 "${TRAIN[@]}" --target v5e --mesh fsdp=8,tensor=2 --decode-mesh data=4,tensor=4 \
    --decode-batch 32 "${COLLECT[@]}"
plan v5e32_fsdp8_tensor4 32 "${TRAIN[@]}" --target v5e --mesh fsdp=8,tensor=4 --decode-mesh data=8,tensor=4 \
    --decode-batch 64 "${COLLECT[@]}"

# The measured H200 configuration (results/studies/gpu_h200_7b/): 4 rows of 1,024 tokens (a 256-token prompt, 16
# blocks of 16 noisy and clean), the reference over the whole row as that script packed it, remat; decoding at
# batch 1 and 8 with the 64-token Jacobi forward over 1,024 slots.
H200_1=(--model qwen2.5-7b --target h200 --mesh fsdp=1 --context 1024 --block-size 64)
plan h200_1_train_b1 1 "${H200_1[@]}" --seq-len 1024 --batch 4 --prompt-len 256 --teacher-len 1024 --decode-batch 1
plan h200_1_decode_b8 1 "${H200_1[@]}" --skip-train --decode-batch 8

# 7B decoding on v5e slices: the heads split over tensor (28 query and 4 KV heads: tensor 4 at most).
plan v5e4_tensor4_b1 4 --model qwen2.5-7b --target v5e --mesh tensor=4 --skip-train --decode-batch 1 --context 1024 \
    --block-size 64
plan v5e4_tensor4_b8 4 --model qwen2.5-7b --target v5e --mesh tensor=4 --skip-train --decode-batch 8 --context 1024 \
    --block-size 64
plan v5e8_data2_tensor4_b2 8 --model qwen2.5-7b --target v5e --mesh data=2,tensor=4 --skip-train --decode-batch 2 \
    --context 1024 --block-size 64
plan v5e8_tensor8_refused 8 --model qwen2.5-7b --target v5e --mesh tensor=8 --skip-train --decode-batch 1
