"""Decodes a batch with ar, jacobi and mr on one device and on (data, fsdp, tensor) meshes of 8 simulated CPU
devices; prints a JSON report on its last stdout line.

Started by tests/test_sharded_decoding.py in a subprocess with XLA_FLAGS=--xla_force_host_platform_device_count=8.
The test model has 4 query and 2 KV heads, so tensor = 2 splits both; tensor = 4 must be refused by name.
"""

import json

import jax
import numpy as np

from jf_jax.decoding.ar import generate_ar
from jf_jax.decoding.jacobi import generate_jacobi
from jf_jax.decoding.multiblock import generate_mr
from jf_jax.decoding.placement import place_params
from jf_jax.decoding.sampling import Sampling
from jf_jax.model.decode_view import decode_view
from jf_jax.model.sharding import make_mesh
from tests.support.decoding_models import CFG, random_params

MESHES = ((1, 1, 2), (2, 2, 2), (4, 1, 2))


def decode_all(view, prompts, mesh, sampling):
    kw = dict(max_new_tokens=12, eos_ids=[], batch_size=4, mesh=mesh, sampling=sampling, seed=3)
    return {"ar": generate_ar(view, CFG, prompts, **kw).token_ids,
            "jacobi": generate_jacobi(view, CFG, prompts, block_size=4, **kw).token_ids,
            "mr": generate_mr(view, CFG, prompts, block_size=4, num_blocks=2, pool_size=2, **kw).token_ids}


def main():
    view = decode_view(random_params(0))
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, CFG.vocab_size, n).tolist() for n in (5, 9, 3, 7)]
    report = {"devices": jax.device_count(), "meshes": {}}
    greedy, sampled = Sampling(), Sampling(temperature=0.8, top_k=20)
    one = {"greedy": decode_all(view, prompts, None, greedy)["ar"],
           "sampled": generate_ar(view, CFG, prompts, max_new_tokens=12, eos_ids=[], batch_size=4,
                                  sampling=sampled, seed=3).token_ids}
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
    try:
        place_params(make_mesh(2, 1, tensor=4), view, CFG)
        report["tensor4"] = "accepted"
    except ValueError as e:
        report["tensor4"] = str(e)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
