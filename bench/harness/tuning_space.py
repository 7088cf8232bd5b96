"""What a tuning sweep searches (bench/harness/tuning.py): each case's space, and phase one's trials for every
group (a combination of what is compared) and every study.

A case's space is one of:

    [{optimizer.lr: 0.01}, {optimizer.lr: 0.1}]                  a grid: its points, each a trial's overrides
    {points: [...], scale: 1/d, at: 1540}                         a grid placed by the trained dimension d
    {sample: 4, knobs: {optimizer.lr: {low: 1.0e-3, high: 1.0},   4 points drawn per study: a knob's {low, high}
            mezo.eps: {low: 1.0e-4, high: 1.0e-2},                is log-uniform (whole numbers when both are),
            lozo.rank: [1, 2, 4], optimizer.momentum: 0.9},       a list one of its values, a number fixed;
     scale: 1/d, at: 1540}                                        the learning rate placed by d as a grid's

A study is one independent search per group, as AlgoPerf's external tuning runs several per submission: each with
the same trial budget, at its own seeds (study k runs every seed + STUDY_SEEDS x k) and, for a sampled space, its
own points: the k-th block of one Halton sequence (quasi-random, as AlgoPerf samples its trials and splits them
among its studies), shifted by a random vector (a Cranley-Patterson rotation), so each study's points are spread
over the ranges and the studies' fall in between each other's. A grid is the same in every study, at other seeds.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from hydra.core.override_parser.overrides_parser import OverridesParser

from bench import models
from bench.config import lora_spec, model_spec
from bench.errors import ConfigError

LR = "optimizer.lr"  # what a scale rule places and an extension moves
# How a case's learning rate moves with the trained dimension d, from `at` where its points were measured to work
SCALES = {"1/d": lambda at, d: at / d}
# Study k runs at every seed + STUDY_SEEDS x k: the seeds a sweep names (search, confirm, repeats) are below it, so
# no two studies share a seed
STUDY_SEEDS = 1000
MAX_SAMPLE = 1000  # a study's drawn points: as the budget's bound (bench/harness/tuning.py MAX_BUDGET)
PRIMES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37)  # Halton's bases, one per knob drawn
DRAWS = 0x5EED  # what the sequence's random shift is drawn from: the same points on every rerun


class Group(NamedTuple):
    """What a search tunes: the combination compared (tune_group) in one study (tune_study), with the seed its
    search trials run at (None: the config's own, study 0's)."""

    name: str
    study: int = 0
    seed: int | None = None


@dataclass(frozen=True)
class Space:
    """One case's search: its grid's points or the knobs it draws `sample` points from, and how the learning rate
    moves with the trained dimension."""

    points: list[dict]
    scale: str | None = None  # a SCALES rule for the points' learning rates, or None: the points as given
    at: float | None = None  # the trained dimension the points were measured to work at
    sample: int | None = None  # points drawn per study from knobs (None: the grid, points)
    knobs: dict | None = None

    @property
    def size(self) -> int:
        """The points a study searches: the trials its budget must hold first."""
        return self.sample if self.sample is not None else len(self.points)

    def placed(self, d: int | None, study: int = 0) -> list[dict]:
        """The study's points at trained dimension d: each learning rate x the rule's factor, to 3 significant
        digits."""
        points = self.points if self.sample is None else drawn(self.knobs, self.sample, study)
        if self.scale is None:
            return points
        factor = SCALES[self.scale](self.at, d)
        return [{**p, LR: f"{float(p[LR]) * factor:.3g}"} for p in points]


def halton(n: int, dims: int, study: int) -> np.ndarray:
    """Study k's n points of one Halton sequence in [0, 1)^dims: its k-th block of n, every coordinate shifted (mod
    1) by one random vector: (n, dims). A coordinate's blocks of 2^j points (base 2, the first) are evenly spaced
    and fall in between each other's."""
    shift = np.random.default_rng(DRAWS).random(dims)
    out = np.zeros((n, dims))
    for j, base in enumerate(PRIMES[:dims]):
        for i in range(n):  # the radical inverse of the index in base: its digits mirrored past the point
            k, f = study * n + i, 1.0
            while k:
                f /= base
                k, digit = divmod(k, base)
                out[i, j] += digit * f
    return (out + shift) % 1.0


def drawn(knobs: Mapping, n: int, study: int) -> list[dict]:
    """A study's n points from its knobs: {low, high} log-uniform (rounded when both are whole numbers), a list one
    of its values, anything else fixed. The learning rate takes the sequence's most even coordinate."""
    free = sorted((k for k, v in knobs.items() if isinstance(v, (Mapping, list))), key=lambda k: k != LR)
    u = halton(n, len(free), study)
    points = []
    for row in u:
        point = {k: v for k, v in knobs.items() if k not in free}
        for x, key in zip(row, free):
            spec = knobs[key]
            if isinstance(spec, list):
                point[key] = spec[min(int(x * len(spec)), len(spec) - 1)]
                continue
            low, high = spec["low"], spec["high"]
            value = math.exp(math.log(low) + x * (math.log(high) - math.log(low)))
            whole = all(isinstance(b, int) and not isinstance(b, bool) for b in (low, high))
            point[key] = round(value) if whole else float(f"{value:.3g}")
        points.append(point)
    return points


def _knobs(name: str, knobs) -> dict:
    """A sampled space's knobs, checked (ConfigError, one line)."""
    if not isinstance(knobs, Mapping) or not knobs:
        raise ConfigError(f"hydra.sweeper.space.{name}.knobs={knobs}: accepted a mapping {{override: its range}}")
    free = 0
    for key, spec in knobs.items():
        where = f"hydra.sweeper.space.{name}.knobs.{key}={spec}"
        if isinstance(spec, list):
            free += 1
            if not spec:
                raise ConfigError(f"{where}: accepted a list of at least one value")
        elif isinstance(spec, Mapping):
            free += 1
            low, high = spec.get("low"), spec.get("high")
            numbers = all(isinstance(b, (int, float)) and not isinstance(b, bool) for b in (low, high))
            if set(spec) != {"low", "high"} or not numbers or not 0 < low <= high:
                raise ConfigError(f"{where}: accepted {{low, high}}, numbers with 0 < low <= high (log-uniform)")
    if free > len(PRIMES):
        raise ConfigError(f"hydra.sweeper.space.{name}.knobs: {free} drawn; accepted at most {len(PRIMES)}")
    return dict(knobs)


def space_of(name: str, spec) -> Space:
    """A case's space from the config: a list of points, {points, scale, at} or {sample, knobs, scale, at}
    (ConfigError, one line)."""
    if not isinstance(spec, Mapping):
        return Space([dict(p) for p in spec or ()])
    if unknown := sorted(set(spec) - {"points", "scale", "at", "sample", "knobs"}):
        raise ConfigError(f"hydra.sweeper.space.{name}.{unknown[0]}: accepted points, scale, at, sample, knobs")
    sample = spec.get("sample")
    if sample is not None or spec.get("knobs") is not None:
        if spec.get("points") is not None:  # null: a drawn space in place of an experiment's grid it extends
            raise ConfigError(f"hydra.sweeper.space.{name}: points or sample and knobs; accepted one of them")
        if isinstance(sample, bool) or not isinstance(sample, int) or not 1 <= sample <= MAX_SAMPLE:
            raise ConfigError(
                f"hydra.sweeper.space.{name}.sample={sample}: accepted an integer in [1, {MAX_SAMPLE:,}], the points "
                "each study draws from its knobs"
            )
        space = Space([], spec.get("scale"), spec.get("at"), sample, _knobs(name, spec.get("knobs")))
    else:
        space = Space([dict(p) for p in spec.get("points") or ()], spec.get("scale"), spec.get("at"))
    if space.scale is not None:
        if space.scale not in SCALES:
            raise ConfigError(
                f"hydra.sweeper.space.{name}.scale={space.scale}: accepted {' | '.join(SCALES)} (how the "
                "learning rate moves with the trained parameters)"
            )
        if isinstance(space.at, bool) or not isinstance(space.at, (int, float)) or space.at <= 0:
            raise ConfigError(
                f"hydra.sweeper.space.{name}.at={space.at}: accepted a positive number, the trained parameters "
                "its points were measured to work at"
            )
        if any(LR not in p for p in space.points) or (space.knobs is not None and LR not in space.knobs):
            raise ConfigError(f"hydra.sweeper.space.{name}: scale={space.scale} needs {LR} in every point")
    return space


def trained_params(cfg) -> int:
    """The parameters a composed config trains: the dimension a one-direction estimate's variance grows with."""
    spec = model_spec(cfg.model)
    return models.of(spec).count_params(spec, cfg.trainable, cfg.last_k, lora_spec(cfg.lora))


def study_seed(seed: int, study: int) -> int:
    """Where study k runs a seed the sweep names."""
    return seed + STUDY_SEEDS * study


def expand(
    params: Mapping[str, str] | None,
    space: Mapping,
    arguments: Sequence[str],
    dimension: Callable[[list[str]], int] | None = None,
    budget: int | None = None,
    studies: int = 1,
    reserve: int = 0,
    seed: int = 0,
) -> list[tuple[Group, list[str]]]:
    """Phase one's trials: (Group, overrides) for every combination of `params` and the command line's sweeps,
    every study, times the study's points of that combination's case (or mode), placed by `dimension(combination)`
    (its trained parameters) where the case's space has a scale rule; study k > 0 at seed `seed` + STUDY_SEEDS k.
    ConfigError (one line) for a combination without a space, an empty space, spaces of different sizes (the budget
    is the same for every mode), or a budget smaller than the points and the `reserve` (confirming trials) after
    them."""
    parser = OverridesParser.create()
    overrides = parser.parse_overrides([*(f"{k}={v}" for k, v in (params or {}).items()), *arguments])
    lists, compared = {}, set(params or {})  # what a group is named by: the keys compared
    for o in overrides:
        key = o.get_key_element()
        values = list(o.sweep_string_iterator()) if o.is_sweep_override() else [o.get_value_element_as_str()]
        lists[key] = [f"{key}={v}" for v in values]
        if len(values) > 1:
            compared.add(key)
    spaces = {name: space_of(name, spec) for name, spec in space.items()}
    sizes = {name: s.size for name, s in spaces.items()}
    if not sizes or min(sizes.values()) == 0:
        raise ConfigError(
            f"hydra.sweeper.space={dict(sizes)}: a search space is empty; accepted: at least one point per case"
        )
    if len(set(sizes.values())) > 1:
        raise ConfigError(
            f"hydra.sweeper.space: {sizes} points; accepted: the same number for every case (the "
            "tuning budget is the same for every way of differentiating)"
        )
    if budget is not None and budget < max(sizes.values()) + reserve:
        confirms = f" and {reserve} confirming" if reserve else ""
        raise ConfigError(
            f"hydra.sweeper.budget={budget}: smaller than the {max(sizes.values())} points{confirms} of each case's "
            "study; accepted: at least as many (the points, any beyond them, and the confirming trials)"
        )
    trials = []
    for combo in itertools.product(*lists.values()):
        choices = dict(o.split("=", 1) for o in combo)
        name = choices.get("case") or choices.get("+case") or choices.get("mode")
        if name not in spaces:
            raise ConfigError(f"case={name}: no search space in hydra.sweeper.space; accepted: {' | '.join(space)}")
        tune_group = " ".join(o for o in combo if o.split("=", 1)[0] in compared)
        if spaces[name].scale is not None and dimension is None:
            raise ConfigError(f"hydra.sweeper.space.{name}: scale={spaces[name].scale} needs the trained parameters")
        d = dimension(list(combo)) if spaces[name].scale is not None else None
        for study in range(studies):
            group = Group(tune_group, study, study_seed(seed, study) if study else None)
            at = [f"seed={group.seed}"] if study else []
            for point in spaces[name].placed(d, study):
                tags = ["tuning=search", f"tune_group='{tune_group}'", f"tune_study={study}", *at]
                trials.append((group, [*combo, *(f"{k}={v}" for k, v in dict(point).items()), *tags]))
    return trials
