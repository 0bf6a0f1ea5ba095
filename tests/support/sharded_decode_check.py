"""Decodes a batch with ar, jacobi and mr on one device and on (data, fsdp, tensor) meshes of 8 simulated CPU
devices; prints a JSON report on its last stdout line.

Started by tests/test_sharded_decoding.py in a subprocess with XLA_FLAGS=--xla_force_host_platform_device_count=8.
The test model has 4 query and 2 KV heads, so tensor = 2 splits both; tensor = 4 must be refused by name. The CPU
decode-attention kernel does not take its head size (16: only the cache-write kernel runs in its programs), so the
same model with heads of 32 also decodes on a 2x2x2 mesh, where that kernel runs on each device's rows and heads.
"""

import json

import jax
import numpy as np

import cpu_kernels
from jf_jax.decoding.ar import generate_ar
from jf_jax.decoding.jacobi import generate_jacobi
from jf_jax.decoding.multiblock import generate_mr
from jf_jax.decoding.placement import place_params
from jf_jax.decoding.sampling import Sampling
from jf_jax.model.decode_view import decode_view
from jf_jax.model.params import init_params
from jf_jax.model.sharding import make_mesh
from tests.support.decoding_models import CFG, random_params

MESHES = ((1, 1, 2), (2, 2, 2), (4, 1, 2))
KERNEL_CFG = CFG.replace(head_dim=32)
"""The test model with a head size the CPU decode-attention kernel takes (a multiple of 32): its decoders on a mesh
run that kernel per device (``sharding.per_device``), mr's candidate rows over their prompts' cache rows."""


def decode_all(view, prompts, mesh, sampling, cfg=CFG):
    kw = dict(max_new_tokens=12, eos_ids=[], batch_size=4, mesh=mesh, sampling=sampling, seed=3)
    return {"ar": generate_ar(view, cfg, prompts, **kw).token_ids,
            "jacobi": generate_jacobi(view, cfg, prompts, block_size=4, **kw).token_ids,
            "mr": generate_mr(view, cfg, prompts, block_size=4, num_blocks=2, pool_size=2, **kw).token_ids}


def with_attention_kernel(prompts, greedy) -> dict:
    """KERNEL_CFG's greedy jacobi and mr against its AR on a 2x2x2 mesh (rows and heads split), and that AR against
    one device's; whether the kernel runs here."""
    params = init_params(KERNEL_CFG, jax.random.PRNGKey(1))
    view = decode_view({**params, "embed": params["embed"] * 4.0})
    runs = decode_all(view, prompts, make_mesh(2, 2, tensor=2), greedy, KERNEL_CFG)
    one = generate_ar(view, KERNEL_CFG, prompts, max_new_tokens=12, eos_ids=[], batch_size=4, seed=3).token_ids
    return {"kernel_runs": cpu_kernels.attention_available(), "ar_equals_one_device": runs["ar"] == one,
            "jacobi_equals_ar": runs["jacobi"] == runs["ar"], "mr_equals_ar": runs["mr"] == runs["ar"]}


def main():
    view = decode_view(random_params(0))
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, CFG.vocab_size, n).tolist() for n in (5, 9, 3, 7)]
    report = {"devices": jax.device_count(), "meshes": {}}
    greedy, sampled = Sampling(), Sampling(temperature=0.8, top_k=20)
    one = {name: generate_ar(view, CFG, prompts, max_new_tokens=12, eos_ids=[], batch_size=4, sampling=sampling,
                             seed=3).token_ids for name, sampling in (("greedy", greedy), ("sampled", sampled))}
    for shape in MESHES:
        mesh = make_mesh(shape[0], shape[1], tensor=shape[2])
        placed = place_params(mesh, view, CFG)
        record = {"wq_spec": str(placed.layers[0]["wq"][0].sharding.spec),
                  "lm_head_spec": str(placed.lm_head[0].sharding.spec)}
        for name, sampling in (("greedy", greedy), ("sampled", sampled)) if shape == MESHES[-1] else (
                ("greedy", greedy),):
            runs = decode_all(view, prompts, mesh, sampling)
            record[name] = {"ar_equals_one_device": runs["ar"] == one[name],
                            "jacobi_equals_ar": runs["jacobi"] == runs["ar"], "mr_equals_ar": runs["mr"] == runs["ar"]}
        report["meshes"]["x".join(map(str, shape))] = record
    report["attention_kernel"] = with_attention_kernel(prompts, greedy)
    try:
        place_params(make_mesh(2, 1, tensor=4), view, CFG)
        report["tensor4"] = "accepted"
    except ValueError as e:
        report["tensor4"] = str(e)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
