"""The ops of scenario `ops`, framework-neutral: what each op takes for a shape, and its primal, jvp and vjp written
out in numpy. The numpy derivatives are the analytic ones every framework's jvp and vjp are checked against; the
inputs are made here, once, so torch and jax see the same bytes.

A shape is (rows, cols); sizes n stand for (n, n). Every op's first input has the shape, except broadcast's (a row
of `cols` values broadcast to (rows, cols)). Conventions where an op has a choice:
  matmul     x @ y with x (rows, cols) and y (cols, cols): the output has the shape, like the elementwise ops
  max        elementwise maximum(x, y); where x == y both frameworks split the derivative in half
  power      x ** y elementwise, both differentiated; x > 0 so that d/dy = log(x) x**y exists
  sum        every element, to a scalar
  relu       max(x, 0); the derivative at 0 is 0 in both frameworks
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

Shape = tuple[int, int]

# dtype name -> (numpy carrier dtype, machine epsilon). bf16 values travel as float32 arrays holding numbers that
# bf16 represents exactly (numpy has no bfloat16); each framework casts them without rounding.
DTYPES = {
    "fp32": (np.float32, 2.0**-23),
    "fp64": (np.float64, 2.0**-52),
    "bf16": (np.float32, 2.0**-7),
}

# Input domains. Positive inputs (log's argument, a divisor, a power's base) come from [0.5, 2]: away from the
# poles of the derivative formulas, so a correct derivative is never large enough to hide an error.
NORMAL, POSITIVE = "normal", "positive"


@dataclass(frozen=True)
class Op:
    name: str
    about: str  # what it computes, in a line, for the reader of this table
    inputs: Callable[[Shape], tuple[tuple[tuple[int, ...], str], ...]]  # (shape, domain) of each input
    # broadcast's primal and jvp depend on the shape it broadcasts to: None here, see primal() and jvp() below
    primal: Callable[..., np.ndarray] | None  # f(*x)
    jvp: Callable[[tuple, tuple], np.ndarray] | None  # (x, tangents) -> tangent of f's output
    vjp: Callable[[tuple, np.ndarray], tuple]  # (x, cotangent) -> cotangent of each input
    # Longest sum in the primal, jvp or vjp. Rounding error grows with it, and so does the check's tolerance.
    reduction: Callable[[Shape], int] = lambda shape: 1


def _same(*domains):
    return lambda shape: tuple((shape, d) for d in domains)


def _ge(x, y):
    """d maximum(x, y) / dx: 1 where x wins, 1/2 at ties (torch's and jax's convention), 0 where y wins."""
    return np.where(x > y, 1.0, np.where(x == y, 0.5, 0.0))


OPS: dict[str, Op] = {
    op.name: op
    for op in [
        Op("add", "x + y", _same(NORMAL, NORMAL), lambda x, y: x + y, lambda p, t: t[0] + t[1], lambda p, ct: (ct, ct)),
        Op(
            "broadcast",
            "a row v (cols,) broadcast to (rows, cols)",
            lambda s: (((s[1],), NORMAL),),
            None,
            None,
            lambda p, ct: (ct.sum(axis=0),),
            lambda s: s[0],
        ),
        Op("copy", "a copy of x", _same(NORMAL), lambda x: x.copy(), lambda p, t: t[0], lambda p, ct: (ct,)),
        Op(
            "divide",
            "x / y, y in [0.5, 2]",
            _same(NORMAL, POSITIVE),
            lambda x, y: x / y,
            lambda p, t: t[0] / p[1] - p[0] * t[1] / p[1] ** 2,
            lambda p, ct: (ct / p[1], -ct * p[0] / p[1] ** 2),
        ),
        Op(
            "exp", "exp(x)", _same(NORMAL), np.exp, lambda p, t: np.exp(p[0]) * t[0], lambda p, ct: (ct * np.exp(p[0]),)
        ),
        Op(
            "log",
            "log(x), x in [0.5, 2]",
            _same(POSITIVE),
            np.log,
            lambda p, t: t[0] / p[0],
            lambda p, ct: (ct / p[0],),
        ),
        Op(
            "matmul",
            "x @ y, x (rows, cols), y (cols, cols)",
            lambda s: ((s, NORMAL), ((s[1], s[1]), NORMAL)),
            lambda x, y: x @ y,
            lambda p, t: t[0] @ p[1] + p[0] @ t[1],
            lambda p, ct: (ct @ p[1].T, p[0].T @ ct),
            lambda s: max(s),
        ),
        Op(
            "max",
            "elementwise maximum(x, y)",
            _same(NORMAL, NORMAL),
            np.maximum,
            lambda p, t: _ge(*p) * t[0] + (1.0 - _ge(*p)) * t[1],
            lambda p, ct: (ct * _ge(*p), ct * (1.0 - _ge(*p))),
        ),
        Op(
            "multiply",
            "x * y",
            _same(NORMAL, NORMAL),
            lambda x, y: x * y,
            lambda p, t: t[0] * p[1] + p[0] * t[1],
            lambda p, ct: (ct * p[1], ct * p[0]),
        ),
        Op("negate", "-x", _same(NORMAL), np.negative, lambda p, t: -t[0], lambda p, ct: (-ct,)),
        Op(
            "power",
            "x ** y, x in [0.5, 2]",
            _same(POSITIVE, NORMAL),
            np.power,
            lambda p, t: p[1] * p[0] ** (p[1] - 1) * t[0] + np.log(p[0]) * p[0] ** p[1] * t[1],
            lambda p, ct: (ct * p[1] * p[0] ** (p[1] - 1), ct * np.log(p[0]) * p[0] ** p[1]),
        ),
        Op(
            "relu",
            "max(x, 0)",
            _same(NORMAL),
            lambda x: np.maximum(x, 0.0),
            lambda p, t: (p[0] > 0) * t[0],
            lambda p, ct: ((p[0] > 0) * ct,),
        ),
        Op(
            "subtract",
            "x - y",
            _same(NORMAL, NORMAL),
            lambda x, y: x - y,
            lambda p, t: t[0] - t[1],
            lambda p, ct: (ct, -ct),
        ),
        Op(
            "sum",
            "sum of every element (a scalar)",
            _same(NORMAL),
            lambda x: x.sum(),
            lambda p, t: t[0].sum(),
            lambda p, ct: (np.full(p[0].shape, ct),),
            lambda s: s[0] * s[1],
        ),
        Op(
            "transpose",
            "x.T, written out (cols, rows)",
            _same(NORMAL),
            lambda x: x.T.copy(),
            lambda p, t: t[0].T,
            lambda p, ct: (ct.T,),
        ),
    ]
}
OP_NAMES = tuple(OPS)


def broadcast_to(shape: Shape):
    return lambda v: np.broadcast_to(v, shape).copy()


def primal(op: Op, shape: Shape):
    """op's numpy primal for a shape (broadcast needs the shape it broadcasts to)."""
    return broadcast_to(shape) if op.name == "broadcast" else op.primal


def jvp(op: Op, shape: Shape):
    return (lambda p, t: np.broadcast_to(t[0], shape).copy()) if op.name == "broadcast" else op.jvp


# ---------------------------------------------------------------------------------------------------------------
# inputs: the same bytes for both frameworks


@dataclass(frozen=True)
class Problem:
    """One op at one shape and dtype: primals x, tangents t (one per input), the cotangent of the output, all as
    numpy arrays of the dtype's carrier (values the dtype represents exactly), and the analytic results."""

    op: str
    shape: Shape
    dtype: str
    primals: tuple[np.ndarray, ...]
    tangents: tuple[np.ndarray, ...]
    cotangent: np.ndarray

    def want(self) -> dict[str, object]:
        """Analytic primal output, jvp (tangent out) and vjp (cotangents in), in float64."""
        op, x = OPS[self.op], tuple(a.astype(np.float64) for a in self.primals)
        t = tuple(a.astype(np.float64) for a in self.tangents)
        return {
            "primal": primal(op, self.shape)(*x),
            "jvp": jvp(op, self.shape)(x, t),
            "vjp": op.vjp(x, self.cotangent.astype(np.float64)),
        }


def shape_name(shape: Shape) -> str:
    return f"{shape[0]}x{shape[1]}"


def _round(x: np.ndarray, dtype: str) -> np.ndarray:
    carrier = DTYPES[dtype][0]
    if dtype != "bf16":
        return np.array(x, dtype=carrier)
    # float32 -> nearest bfloat16 (ties to even), kept in a float32 array: bf16 is float32's top 16 bits
    bits = np.array(x, dtype=np.float32).view(np.uint32)
    bits = (bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return bits.view(np.float32)


def _draw(rng: np.random.Generator, shape: tuple[int, ...], domain: str) -> np.ndarray:
    if domain == POSITIVE:
        return rng.uniform(0.5, 2.0, shape)
    return rng.standard_normal(shape)


def make_problem(name: str, shape: Shape, dtype: str, seed: int = 0) -> Problem:
    """Inputs for one op at one shape: seeded by (seed, op, shape), so each framework draws the same numbers."""
    op = OPS[name]
    rng = np.random.default_rng([seed, zlib.crc32(name.encode()), *shape])
    specs = op.inputs(shape)
    primals = tuple(_round(_draw(rng, s, d), dtype) for s, d in specs)
    tangents = tuple(_round(rng.standard_normal(s), dtype) for s, _ in specs)
    out = primal(op, shape)(*(a.astype(np.float64) for a in primals))
    cotangent = _round(rng.standard_normal(np.shape(out)), dtype)
    return Problem(name, shape, dtype, primals, tangents, cotangent)


# ---------------------------------------------------------------------------------------------------------------
# the check: results against the analytic derivative

# 32 eps: a few roundings per element (the primal, the derivative formula, the framework's exp/log/pow, a few ulp
# each) with room to spare; sqrt(reduction): rounding error of a sum of k random-sign terms grows like sqrt(k).
# Capped at 0.1: the check is there to catch wrong derivatives (a missing term, transpose or sign is an O(1)
# error), not to grade bf16 rounding.
TOL_EPS = 32
TOL_CAP = 0.1


def tolerance(name: str, shape: Shape, dtype: str) -> float:
    return min(TOL_CAP, TOL_EPS * DTYPES[dtype][1] * math.sqrt(OPS[name].reduction(shape)))


def relative_error(got, want) -> float:
    """max |got - want| / max |want| over all arrays of a result (one array, or a tuple of them)."""
    got = got if isinstance(got, (tuple, list)) else (got,)
    want = want if isinstance(want, (tuple, list)) else (want,)
    if len(got) != len(want):
        return math.inf
    err = scale = 0.0
    for g, w in zip(got, want, strict=True):
        g, w = np.asarray(g, np.float64), np.asarray(w, np.float64)
        if g.shape != w.shape:
            return math.inf
        err = max(err, float(np.max(np.abs(g - w), initial=0.0)))
        scale = max(scale, float(np.max(np.abs(w), initial=0.0)))
    return err / scale if scale > 0 else err


# ---------------------------------------------------------------------------------------------------------------
# what each framework builds for one op at one shape (torch_impl/ops.py build, jax_impl/ops.py build)


@dataclass(frozen=True)
class Transforms:
    """The callables one framework builds for one op at one shape. Arrays are that framework's, on its device.

    primal(x)          f(*x)
    jvp(x, t)          (f(x), df(x) t): forward mode, the output's tangent along t
    vjp(x, ct)         (f(x), df(x)^T ct): reverse mode from scratch, the forward pass with residuals included
    forward(x)         (f(x), pullback): the forward half of vjp, run once, untimed
    backward(pb, ct)   pullback(ct): the backward half alone; None where it cannot be built on its own
    Both jvp and vjp return f(x) too: they compute it anyway, and returning it keeps a compiler from dropping
    the primal work that the derivative does not need, so that jvp_s / primal_s and vjp_s / primal_s are the
    costs of a derivative evaluated from scratch.
    """

    primal: Callable
    jvp: Callable
    vjp: Callable
    forward: Callable
    backward: Callable | None
