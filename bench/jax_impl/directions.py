"""Seeded random directions: jvp's tangents and MeZO's perturbations, drawn where they are used and regenerated
from their keys rather than stored. Mirror of torch_impl/directions.py.

A direction is drawn unit by unit. A unit is a big parameter tensor (the word embeddings), the small tensors
outside the layers together with the small stacks whole (one random op, cut into their shapes: BitFit's biases,
a narrow model's layers; see WHOLE), or, with scan_layers, a stack of layers (jax_impl/models/common.py): its
layer i draws one direction over all of its trained tensors at once from the key fold_in(unit's key, i). Unit u
of direction k at `step` has the key fold_in(base(seed, step, k), u), so any unit, and any layer of a stack, can be
drawn again alone, by any program:

    sample_tangent      the whole direction (a stack's layers drawn in a loop): jvp.tangent=keep, tests
    displaced           a forward pass along the direction: each tensor's tangent drawn where the pass uses it, a
                        stack's layer by layer inside the scan (model.LayerHook): one layer's tangent at a time
    perturb             theta + scale z: a stack perturbed layer by layer, in place
    seeded_update       the optimizer's update with g = sum_k c_k z_k: a stack's g one layer at a time
    seeded_gradient     g whole (tests, gradient quality)

Why per layer: a scan's inputs exist before it runs, so a tangent handed to jax.jvp for stacked parameters would be
held whole (BERT-base: +27 MiB per layer), where the unrolled model's draws were each fused into their one
consumer. Why one random op per layer, not per tensor: XLA:CPU compiles every random op apart (~0.1 s each).
Layer i's draw is the same value in every program because every program draws it inside a loop over the layers
with the same key (the rbg generator's values differ between a loop and a vmap, so nothing here vmaps a draw).
"""

from __future__ import annotations

import collections
import functools
import itertools

import jax
import jax.numpy as jnp
import optax
from optax import tree_utils as otu

from bench.jax_impl.models.common import keys_of, stack_of
from bench.spec import UNIT_FLOOR

# The generator of the directions' bits (jax.random's key implementations): see direction_keys.
PRNG_IMPL = "rbg"
# A tensor outside the stacks with at least this many entries (2 MiB in fp32) is a unit of its own (the word
# embeddings; BERT-base's pooler too); the smaller ones share one draw (see _units).
ALONE = 1 << 19
# A stack whose trained tensors hold fewer entries than this over all its layers (4 MiB in fp32: BitFit's biases,
# a narrow model's layers) joins that shared draw, whole, as torch draws such tensors in one unit: drawn layer by
# layer, each perturbation and update ran a loop over the layers whose kernels outnumbered a forward pass's at
# BERT-base's depth (docs/speed.md).
WHOLE = UNIT_FLOOR


def direction_keys(seed: int, step, k, n: int):
    """Keys of direction k of units 0..n-1 at `step` (key i = fold_in(base, i)): any unit's direction can be
    regenerated alone.

    Why "rbg" and one vectorised fold_in: XLA on CPU compiles every random op separately, and a default
    (threefry) normal costs ~0.2 s of compile each; rbg's ~0.1 s. Threefry still derives the keys (one op for all
    units); the bits come from XLA's RngBitGenerator. The streams are statistically sound but, unlike threefry, not
    guaranteed identical across backends or XLA versions (torch's directions differ from JAX's anyway).

    Sharded (fsdp), the values stay those of one device and nothing is exchanged: XLA's SPMD partitioner does not
    partition RngBitGenerator, it gives every device the whole draw and slices out the device's part; XLA:CPU
    then fuses that slice into the (Philox) generator, so a device computes its own part only. jax.jvp's forward
    pass needs the tangent whole: there each device draws all of it, rather than drawing its part and gathering
    the rest."""
    base = jax.random.fold_in(jax.random.fold_in(jax.random.key(seed, impl=PRNG_IMPL), step), k)
    return jax.vmap(lambda i: jax.random.fold_in(base, i))(jnp.arange(n, dtype=jnp.uint32))


def direction(p, key, kind: str = "gaussian"):
    """The direction of p's shape (and dtype) from `key`: N(0, I), or (kind="rademacher") +-1 entries from random
    bits (jax.random.rademacher), both with E[z z^T] = I."""
    if kind == "rademacher":
        return jax.random.rademacher(key, p.shape, p.dtype)
    return jax.random.normal(key, p.shape, p.dtype)


def whole(x):
    """A draw as it is: on one device, whole already (see `layer_direction`'s `gather`)."""
    return x


def layer_direction(like: list, key, kind: str = "gaussian", gather=whole) -> list:
    """One direction over tensors shaped like `like` (a layer's slices of a stack's trained tensors): one draw of
    their total size from `key`, cut into their shapes, in their dtypes. `gather`: the draw and its cuts whole on
    every device (parallel=fsdp: World.gather_whole), so that each device takes its shard of a cut locally: left to
    itself, XLA's partitioner split the flat draw and moved the pieces of each cut to the devices holding that
    tensor's shard (collective-permutes: 24 KB per perturbation on tiny, against none for the unrolled model)."""
    sizes = [int(x.size) for x in like]
    flat = gather(direction(jax.ShapeDtypeStruct((sum(sizes),), like[0].dtype), key, kind))
    cuts = jnp.split(flat, list(itertools.accumulate(sizes[:-1]))) if len(like) > 1 else [flat]
    return [gather(z.reshape(x.shape).astype(x.dtype)) for z, x in zip(cuts, like)]


def _units(leaves_with_paths) -> list[tuple[str | None, list[int]]]:
    """The units of a flattened pytree of trained parameters (or things shaped like them), in order of their first
    leaf: (stack name, its leaves' indices) for a stack of layers drawn layer by layer; (None, [i, j, ...]) for the
    tensors outside the encoder's layers with fewer than ALONE entries and the stacks with fewer than WHOLE, whole,
    one draw cut into their shapes (that draw is held whole, a few MiB: each random op more costs ~0.1 s of compile
    in every program that draws, and MiniLM has eight small tensors outside its layers); (None, [i]) for any other
    tensor (the word embeddings; scan_layers=false, every tensor of a layer), drawn alone where it is consumed, so
    the unrolled model holds no layer's direction whole."""
    sizes = collections.Counter()
    for path, x in leaves_with_paths:
        if stack_of(path) is not None:
            sizes[stack_of(path)[0]] += x.size
    units, stacks = [], {}
    for i, (path, x) in enumerate(leaves_with_paths):
        stack = stack_of(path)
        if stack is None and (x.size >= ALONE or "layer" in keys_of(path)):
            units.append((None, [i]))
        elif stack is None or sizes[stack[0]] < WHOLE:
            if "" not in stacks:
                stacks[""] = len(units)
                units.append((None, []))
            units[stacks[""]][1].append(i)
        elif stack[0] in stacks:
            units[stacks[stack[0]]][1].append(i)
        else:
            stacks[stack[0]] = len(units)
            units.append((stack[0], [i]))
    return units


def held_bytes(params) -> int:
    """The most of a direction over `params` any program holds at once: its largest unit drawn whole, or one layer
    of a stack drawn layer by layer."""
    flat = jax.tree_util.tree_flatten_with_path(params)[0]
    return max(
        (
            sum(flat[j][1].nbytes // (1 if stack is None else flat[j][1].shape[0]) for j in idx)
            for stack, idx in _units(flat)
        ),
        default=0,
    )


def unit_direction(like: list, key, kind: str = "gaussian", gather=whole) -> list:
    """The direction over a unit outside the stacks: a big tensor's own draw (XLA fuses it into its consumer, and
    a sharded device draws its part only: see direction_keys), or the small ones' shared draw (layer_direction)."""
    return [direction(like[0], key, kind)] if len(like) == 1 else layer_direction(like, key, kind, gather)


def _layer(leaves: list, i) -> list:
    return [jax.lax.dynamic_index_in_dim(x, i, keepdims=False) for x in leaves]


def _put(leaves: list, slices: list, i) -> list:
    return [jax.lax.dynamic_update_index_in_dim(x, s.astype(x.dtype), i, 0) for x, s in zip(leaves, slices)]


def sample_tangent(params, seed: int, step, k, kind: str = "gaussian", gather=whole):
    """Direction k of `step` over `params`, whole (a stack's layers drawn in a loop, so the values are those every
    other function here draws)."""
    flat, treedef = jax.tree_util.tree_flatten_with_path(params)
    leaves = [x for _, x in flat]
    units = _units(flat)
    keys = direction_keys(seed, step, k, len(units))
    out = list(leaves)
    for u, (stack, idx) in enumerate(units):
        if stack is None:
            for j, z in zip(idx, unit_direction([leaves[j] for j in idx], keys[u], kind, gather)):
                out[j] = z
            continue
        zeros = [jnp.zeros_like(leaves[j]) for j in idx]
        drawn = jax.lax.fori_loop(
            0,
            leaves[idx[0]].shape[0],
            lambda i, zs, u=u: _put(
                zs, layer_direction(_layer(zs, i), jax.random.fold_in(keys[u], i), kind, gather), i
            ),
            zeros,
        )
        for j, z in zip(idx, drawn):
            out[j] = z
    return jax.tree.unflatten(treedef, out)


@functools.partial(jax.custom_jvp, nondiff_argnums=(3, 4))
def _displaced(leaves: list, t, key, kind: str, layer: bool) -> list:
    """`leaves` unchanged, with the tangent t' z along t: theta + t z at t = 0, z drawn from `key` (a layer's
    direction over all of them, or a unit's outside the stacks) where this is evaluated. The leaves must be
    constants of the derivative (no tangent of their own)."""
    return leaves


@_displaced.defjvp
def _displaced_jvp(kind, layer, primals, tangents):
    leaves, _, key = primals
    t_dot = tangents[1]
    zs = layer_direction(leaves, key, kind) if layer else unit_direction(leaves, key, kind)
    return leaves, [t_dot.astype(z.dtype) * z for z in zs]


def displaced(params, t, seed: int, step, k, kind: str = "gaussian"):
    """(params, layer_hook) for a forward pass along direction k of `step`: differentiated in t at t = 0 (jax.jvp
    with tangent 1), the pass's derivative is grad . z. Each tensor outside the stacks carries its tangent from
    where the pass uses it; a stack's layer gets its tangent from the hook, inside the scan (model.LayerHook)."""
    flat, treedef = jax.tree_util.tree_flatten_with_path(params)
    leaves = [x for _, x in flat]
    units = _units(flat)
    keys = direction_keys(seed, step, k, len(units))
    out, in_stack = list(leaves), {}
    for u, (stack, idx) in enumerate(units):
        if stack is None:
            for j, x in zip(idx, _displaced([leaves[j] for j in idx], t, keys[u], kind, False)):
                out[j] = x
        else:
            in_stack[stack] = (keys[u], [stack_of(flat[j][0])[1] for j in idx])

    def hook(name, state, i):
        if name not in in_stack:  # a stack with nothing trained
            return state
        key, paths = in_stack[name]
        flat_state, state_def = jax.tree_util.tree_flatten_with_path(state)
        where = {keys_of(path): n for n, (path, _) in enumerate(flat_state)}
        slots = [where[p] for p in paths]
        moved = _displaced([flat_state[n][1] for n in slots], t, jax.random.fold_in(key, i), kind, True)
        values = [x for _, x in flat_state]
        for n, x in zip(slots, moved):
            values[n] = x
        return jax.tree.unflatten(state_def, values)

    return jax.tree.unflatten(treedef, out), hook


def perturb(params, scale, seed: int, step, kind: str = "gaussian", gather=whole, k=0, hessian=None):
    """theta + scale * z, z (direction k of `step`) regenerated unit by unit from its keys (no stored noise), a
    stack's layer by layer. Under jit with the parameters donated, XLA writes the result over theta: the in-place
    perturbation of MeZO. `hessian` (a pytree like params): z / sqrt(hessian) instead, HiZOO's perturbation."""
    flat, treedef = jax.tree_util.tree_flatten_with_path(params)
    leaves = [x for _, x in flat]
    hs = None if hessian is None else jax.tree.leaves(hessian)
    shaped = lambda zs, hs_: zs if hs_ is None else [z * jax.lax.rsqrt(h) for z, h in zip(zs, hs_)]  # noqa: E731
    units = _units(flat)
    keys = direction_keys(seed, step, k, len(units))
    out = list(leaves)
    for u, (stack, idx) in enumerate(units):
        if stack is None:
            ps = [leaves[j] for j in idx]
            zs = shaped(unit_direction(ps, keys[u], kind, gather), None if hs is None else [hs[j] for j in idx])
            for j, p, z in zip(idx, ps, zs):
                out[j] = p + scale * z
            continue

        def body(i, ps, u=u, idx=idx):
            slices = _layer(ps, i)
            zs = layer_direction(slices, jax.random.fold_in(keys[u], i), kind, gather)
            zs = shaped(zs, None if hs is None else _layer([hs[j] for j in idx], i))
            return _put(ps, [s + scale * z for s, z in zip(slices, zs)], i)

        for j, x in zip(idx, jax.lax.fori_loop(0, leaves[idx[0]].shape[0], body, [leaves[j] for j in idx])):
            out[j] = x
    return jax.tree.unflatten(treedef, out)


def seeded_gradient(params, coeffs, seed: int, step, kind: str = "gaussian", gather=whole):
    """g = sum_k coeffs[k] * z_k, whole, every z_k regenerated from its keys, one k at a time (tests and gradient
    quality; the timed update is seeded_update's, which never holds a stack's g whole)."""

    def body(k, gs):  # in the parameters' dtype (bf16_pure: the fp32 coefficient would promote it)
        z = sample_tangent(params, seed, step, k, kind, gather)
        return jax.tree.map(lambda g, z, p: (g + coeffs[k] * z).astype(p.dtype), gs, z, params)

    return jax.lax.fori_loop(0, coeffs.shape[0], body, jax.tree.map(jnp.zeros_like, params))


def tangent_gradient(tangents, coeffs):
    """g = sum_k coeffs[k] * tangents[k] for tangents held whole (supplied by the caller, or jvp's kept one)."""
    return jax.tree.map(lambda *ts: sum(c * t for c, t in zip(coeffs, ts)).astype(ts[0].dtype), *tangents)


def seeded_update(
    optimizer: optax.GradientTransformation,
    params,
    opt_state,
    coeffs,
    seed: int,
    step,
    kind: str = "gaussian",
    gather=whole,
    shift=0.0,
):
    """(params, opt_state) after the optimizer's update with g = sum_k coeffs[k] z_k, the z_k regenerated from
    their keys, the parameters first moved by shift * z_0 (MeZO's last +eps z, which puts theta back: fused here,
    one draw of z fewer per step). The tensors outside the stacks are updated together, g fused into their update
    (XLA draws each tensor's z where it is consumed); then each stack one layer at a time in a loop, written back
    in place, so a stack's g exists one layer at a time.

    Layer by layer is exact for optimizers that update every entry from its own gradient and state and a shared
    step count (sgd with momentum and coupled weight decay, adamw: steps.make_optimizer's): each part calls
    optimizer.update on the whole tree with the other parts' tensors as empty slices, every layer reads the step
    count as it was before the step, and the count advances once."""
    flat, treedef = jax.tree_util.tree_flatten_with_path(params)
    leaves = [x for _, x in flat]
    units = _units(flat)
    K = coeffs.shape[0]
    keys = [direction_keys(seed, step, k, len(units)) for k in range(K)]
    # which parameter each leaf of the optimizer state mirrors (AdamW's mu and nu), -1 for shared ones (the count)
    mirrors = otu.tree_map_params(
        optimizer,
        lambda _, j: j,
        opt_state,
        jax.tree.unflatten(treedef, range(len(leaves))),
        transform_non_params=lambda _: -1,
    )

    def update(values: dict, gs: dict, state, i=None) -> tuple[list, object]:
        """optimizer.update of the parameters in `values` (whole, or layer i of stacked ones) with gradients `gs`,
        every other parameter an empty slice; the state's shared leaves as they were in opt_state."""
        empty = lambda x, j, d: d[j] if j in d else x[:0]  # noqa: E731
        p = jax.tree.unflatten(treedef, [empty(x, j, values) for j, x in enumerate(leaves)])
        g = jax.tree.unflatten(treedef, [empty(x, j, gs) for j, x in enumerate(leaves)])
        part = lambda x, j: (x if i is None else _layer([x], i)[0]) if j in values else x[:0]  # noqa: E731
        s = jax.tree.map(lambda x, x0, j: x0 if j < 0 else part(x, j), state, opt_state, mirrors)
        updates, s = optimizer.update(g, s, p)
        return jax.tree.leaves(optax.apply_updates(p, updates)), s

    def step_of(values: list, zs: list[list]) -> tuple[list, list]:
        """(theta + shift z_0, sum_k c_k z_k) of these parameters, zs[k] their z_k."""
        moved = [(x + shift * z).astype(x.dtype) for x, z in zip(values, zs[0])]
        return moved, [sum(coeffs[k] * zs[k][n] for k in range(K)).astype(x.dtype) for n, x in enumerate(values)]

    outside = [j for stack, idx in units if stack is None for j in idx]
    zs = [
        [
            z
            for u, (stack, idx) in enumerate(units)
            if stack is None
            for z in unit_direction([leaves[j] for j in idx], keys[k][u], kind, gather)
        ]
        for k in range(K)
    ]
    moved, gs = step_of([leaves[j] for j in outside], zs)
    updated, state = update(dict(zip(outside, moved)), dict(zip(outside, gs)), opt_state)
    out = [updated[j] if j in outside else x for j, x in enumerate(leaves)]
    state = jax.tree.map(lambda new, old, j: new if j < 0 or j in outside else old, state, opt_state, mirrors)

    for u, (stack, idx) in enumerate(units):
        if stack is None:
            continue

        def body(i, carry, u=u, idx=idx):
            ps, state = carry
            slices = _layer([ps[j] for j in idx], i)
            moved, g = step_of(
                slices, [layer_direction(slices, jax.random.fold_in(keys[k][u], i), kind, gather) for k in range(K)]
            )
            updated, layer_state = update(dict(zip(idx, moved)), dict(zip(idx, g)), state, i)
            ps = [_put([x], [updated[j]], i)[0] if j in idx else x for j, x in enumerate(ps)]
            state = jax.tree.map(lambda x, y, j: _put([x], [y], i)[0] if j in idx else x, state, layer_state, mirrors)
            return ps, state

        out, state = jax.lax.fori_loop(0, leaves[idx[0]].shape[0], body, (out, state))
    return jax.tree.unflatten(treedef, out), state
