set -x
for dt in bfloat16 float32 int8; do
  python -m jf_jax.decode --prompts prompts.txt --methods ar,jacobi,mr --dtype $dt --max-new-tokens 64 --json g_$dt.json > g_$dt.log 2>&1
done
python -m jf_jax.decode --prompts prompts.txt --methods ar,jacobi,mr --dtype bfloat16 --max-new-tokens 64 --temperature 0.7 --seed 3 --json s_bf16.json > s_bf16.log 2>&1
echo done
