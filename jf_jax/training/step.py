"""One optimizer step, jitted with explicit shardings over a ("data", "fsdp") mesh and a donated state.

Gradient accumulation splits the batch into ``grad_accum`` micro-batches (rows ``a, a + A, a + 2A, ...`` so
every device keeps its own rows) and scans over them. Each micro-batch loss is normalised by the token
counts of the *full* batch, so the accumulated gradient equals the full-batch gradient exactly (up to float
summation order).

Metrics (float32 scalars, path-like names): ``loss/total``, ``loss/ar``, ``loss/consistency``,
``learning/grad_norm`` (before clipping), ``learning/lr``, ``learning/param_norm``, ``data/ar_tokens``,
``data/consistency_tokens``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh

from jf_jax.model.config import ModelConfig
from jf_jax.model.params import Params
from jf_jax.training.losses import LossConfig, check_reference, combine, loss_normalizers, weighted_sums
from jf_jax.model.sharding import ShardingRules, batch_shardings, replicated
from jf_jax.training.state import OptimConfig, TrainState, lr_schedule, make_optimizer
from jf_jax.training.packing import BATCH_KEYS


def _split_micro(batch, accum: int):
    """[B, ...] -> [A, B // A, ...], micro-batch a = rows a, a + A, ..."""
    def split(x):
        if x.shape[0] % accum:
            raise ValueError(f"batch size {x.shape[0]} is not divisible by grad_accum={accum}")
        x = x.reshape(x.shape[0] // accum, accum, *x.shape[1:])
        return jnp.swapaxes(x, 0, 1)
    return jax.tree.map(split, batch)


def train_step(state: TrainState, batch, *, cfg: ModelConfig, lcfg: LossConfig, ocfg: OptimConfig,
               optimizer: optax.GradientTransformation, total_steps: int, reference: Params | None = None):
    """Un-jitted step: returns (new state, metrics). ``reference``: the frozen parameters the AR term distils
    from when ``lcfg.ar_teacher == "reference"`` (not part of the state: a run rebuilds them from its config)."""
    norms = loss_normalizers(batch)

    def micro_loss(params, micro):
        sums = weighted_sums(params, cfg, micro, lcfg, reference)
        total, _ = combine(sums, norms, lcfg)
        return total, sums

    grad_fn = jax.value_and_grad(micro_loss, has_aux=True)
    if ocfg.grad_accum == 1:
        (_, sums), grads = grad_fn(state.params, batch)
    else:
        def body(carry, micro):
            grads_acc, sums_acc = carry
            (_, sums), grads = grad_fn(state.params, micro)
            return (jax.tree.map(jnp.add, grads_acc, grads), jax.tree.map(jnp.add, sums_acc, sums)), None

        zeros = (jax.tree.map(jnp.zeros_like, state.params), dict(ar=jnp.zeros(()), consistency=jnp.zeros(())))
        (grads, sums), _ = jax.lax.scan(body, zeros, _split_micro(batch, ocfg.grad_accum))

    _, metrics = combine(sums, norms, lcfg)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics.update({
        "learning/grad_norm": optax.tree.norm(grads),
        "learning/lr": jnp.asarray(lr_schedule(ocfg, total_steps)(state.step), jnp.float32),
        "learning/param_norm": optax.tree.norm(params),
        "data/ar_tokens": norms["ar"],
        "data/consistency_tokens": norms["consistency"],
    })
    metrics = {k: jnp.asarray(v, jnp.float32) for k, v in metrics.items()}
    return TrainState(step=state.step + 1, params=params, opt_state=opt_state), metrics


def _jit_step(state, batch, reference, cfg, lcfg, ocfg, total_steps):
    # The optimizer is rebuilt from the (hashable) configs inside the trace, so identical configs hit the
    # jit caches across ``make_train_step`` calls (e.g. a resumed run in the same process) instead of recompiling.
    optimizer = make_optimizer(cfg, ocfg, total_steps)
    return train_step(state, batch, cfg=cfg, lcfg=lcfg, ocfg=ocfg, optimizer=optimizer, total_steps=total_steps,
                      reference=reference)


def make_train_step(cfg: ModelConfig, lcfg: LossConfig, ocfg: OptimConfig, total_steps: int, mesh: Mesh,
                    rules: ShardingRules, state_sharding: TrainState, reference: Params | None = None):
    """The jitted step ``(state, batch) -> (state, metrics)``: explicit in/out shardings, state donated;
    ``step.lower(state, batch[, reference])`` lowers it ahead of time (abstract arguments welcome).

    The optimizer is ``train_state.make_optimizer(cfg, ocfg, total_steps)``; ``state_sharding`` comes from
    ``train_state.state_shardings`` with that optimizer. ``reference``: the frozen parameters of
    ``lcfg.ar_teacher == "reference"``, placed like ``state_sharding.params`` (``reference_params`` makes them).
    """
    check_reference(lcfg, reference)
    if lcfg.ar_teacher != "reference":
        reference = None  # not traced: a run without distillation compiles exactly as before
    batch_sh = batch_shardings({k: jnp.zeros((1, 1)) for k in BATCH_KEYS}, mesh, rules)
    ref_sh = None if reference is None else state_sharding.params
    jitted = jax.jit(_jit_step, static_argnums=(3, 4, 5, 6), in_shardings=(state_sharding, batch_sh, ref_sh),
                     out_shardings=(state_sharding, replicated(mesh)), donate_argnums=0)

    # Traced under the mesh, so the model keeps activations split by rows (``sharding.constrain_rows``).
    def step(state, batch):
        with jax.set_mesh(mesh):
            return jitted(state, batch, reference, cfg, lcfg, ocfg, total_steps)

    # Ahead-of-time lowering of the same program (the state, batch and reference may be ShapeDtypeStructs): what
    # its compiled ``memory_analysis()`` says a step needs is known before any array is allocated.
    def lower(state, batch, reference=reference):
        with jax.set_mesh(mesh):
            return jitted.lower(state, batch, reference, cfg, lcfg, ocfg, total_steps)

    step.lower = lower
    return step


def reference_params(params: Params, cfg: ModelConfig) -> Params:
    """A frozen copy of ``params`` for ``ar_teacher="reference"``: the matmul weights (embedding, head, ``w*``)
    stored in the compute dtype, since every dot casts them to it anyway (same logits, half the memory in
    bfloat16, no per-step cast); norm scales and biases, applied in float32, kept as they are."""
    def copy(path, p):
        name = path[-1].key
        matmul = name in ("embed", "lm_head") or name.startswith("w")
        return p.astype(cfg.compute_dtype) if matmul else jnp.array(p, copy=True)

    return jax.tree_util.tree_map_with_path(copy, params)


def put_batch(batch, mesh: Mesh, rules: ShardingRules):
    """Host numpy batch -> device arrays split over the batch mesh axes (rows must divide evenly)."""
    divisor = rules.batch_divisor(mesh)
    rows = next(iter(batch.values())).shape[0]
    if rows % divisor:
        raise ValueError(f"batch of {rows} rows cannot be split over {divisor} data-parallel devices")
    return jax.device_put(batch, batch_shardings(batch, mesh, rules))
