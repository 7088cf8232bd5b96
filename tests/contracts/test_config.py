"""The configuration's contracts: every experiment and preset in conf/ composes and validates, a trial's identity
(what resume compares) hashes as it did when earlier rows were recorded, and the defaults the report assumes for
rows without a knob's column are the presets' own."""

from __future__ import annotations

import pytest
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from bench.config import CONF_DIR, from_dict, to_dict
from bench.data import data_spec, make_batches
from bench.errors import ConfigError
from bench.harness.preflight import compose_trials, expand_sweep, preflight
from bench.harness.scenario import config_hash, scenario_of
from bench.scenarios import SCENARIOS
from bench.scenarios.model.select import OPTIMIZER_DEFAULTS, context_key
from tests.support import REPO, composed, trial

EXPERIMENTS = sorted(p.stem for p in (REPO / "conf" / "experiment").glob("*.yaml"))


def experiment_params(fast: set[str]) -> list:
    """Every experiment, those outside `fast` marked slow: composing one is Hydra reading and merging every file of
    each group combination it sweeps (0.5-5 s an experiment, 25 experiments), so make test-fast keeps a few of each
    kind and make test composes them all."""
    assert fast <= set(EXPERIMENTS), fast - set(EXPERIMENTS)
    return [n if n in fast else pytest.param(n, marks=pytest.mark.slow) for n in EXPERIMENTS]


# the main job, a sweep over modes and estimators' knobs, a GPU grid (the cost experiments, which compose each scope
# to place their points, and decoder_vs_encoder, both families' grids, take seconds each)
COMPOSED_FAST = {"default_bench", "zo_family", "shapes_gpu"}
# preflight's shortcut against Hydra's own compose: the main job, a sweep of groups (case=), one of values (trainable=)
MATCHED_FAST = {"default_bench", "memory_explained", "trainable_scaling"}


@pytest.mark.parametrize("name", experiment_params(COMPOSED_FAST))
def test_every_experiment_composes_and_validates(name):
    assert preflight([f"+experiment={name}"], multirun=True, scenarios=SCENARIOS) >= 2  # each one is a sweep


def plain_compose(combo: list[str]) -> dict:
    """A trial's config as Hydra's compose API makes it, every file read and merged for it alone."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return OmegaConf.to_container(compose("config", overrides=combo))


@pytest.mark.parametrize("name", experiment_params(MATCHED_FAST))
def test_preflight_composes_each_trial_as_hydra_does(name):
    """Preflight composes the groups a trial chooses once per command line and applies each trial's values to a
    copy (bench/harness/preflight.py): every trial must be the config Hydra's own compose gives it (here the
    experiment's last trial, whose values differ most from the first's)."""
    combo = expand_sweep([f"+experiment={name}"], multirun=True)[-1]
    ((_, fast),), _ = compose_trials(combo, multirun=False)
    assert OmegaConf.to_container(fast) == plain_compose(combo)


def test_preflight_applies_values_as_hydra_does():
    """The override forms a command line may hold, beside groups: a value that a case preset also sets (the
    command line wins), a nested value, a list, a new key (+), and what Hydra refuses (a bad value, a deletion)."""
    combo = [
        "case=jvp",
        "jvp.num_tangents=3",
        "optimizer=adamw",
        "optimizer.lr=0.5",
        "lora.targets=[query,value]",
        "model=tiny",
        "+note=x",
    ]
    ((_, fast),), _ = compose_trials(combo, multirun=False)
    assert OmegaConf.to_container(fast) == plain_compose(combo)
    # trials sharing their groups share one composition: the first's values must not reach the second
    (_, first), (second_combo, second) = compose_trials(["model=tiny", "jvp.num_tangents=3,1"], multirun=True)[0]
    assert first.jvp.num_tangents == 3 and second.jvp.num_tangents == 1
    assert OmegaConf.to_container(second) == plain_compose(second_combo)
    assert fast.jvp.num_tangents == 3 and fast.optimizer.lr == 0.5 and fast.note == "x"
    with pytest.raises(ConfigError, match="batch_size"):
        compose_trials(["model=tiny", "batch_size=abc"], multirun=False)
    with pytest.raises(ConfigError, match="Could not delete from config. 'sweep_id' does not exist"):
        compose_trials(["model=tiny", "~sweep_id"], multirun=False)  # null: nothing to delete, as Hydra says


@pytest.mark.parametrize("name", sorted(p.stem for p in (CONF_DIR / "data").glob("*.yaml")))
def test_conf_data_presets_compose(name):
    node = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "data" / f"{name}.yaml"))
    assert node.pop("defaults") == ["data_schema"]  # the preset is checked against the schema by Hydra
    spec = data_spec(node)
    assert spec.name == name
    if name == "synthetic":
        assert len(make_batches(spec, batch_size=32, seq_len=16, seed=0)) == spec.num_train // 32


def hash_of(*overrides: str) -> str:
    cfg = composed(*overrides)
    return config_hash(scenario_of(SCENARIOS, cfg.scenario), cfg)


@pytest.mark.parametrize(
    "overrides, recorded",
    [
        ([], "a012dc79b6f5"),
        # JAX's layers were unrolled then: a trial of today's scanned layers is another configuration
        (["model=tiny", "mode=jvp", "framework=jax", "scan_layers=false"], "7f3824ff2e69"),
        (["scenario=ops"], "1033d1d4e175"),
    ],
)
def test_config_hashes_of_earlier_rows_still_match(overrides, recorded):
    """Hashes recorded before the parallel keys existed (and before the layout change): resume=true finds those
    rows only while a trial at the defaults of every key added since hashes as it did then."""
    assert hash_of(*overrides) == recorded
    assert hash_of(*overrides, "scan_layers=true") != recorded or "framework=jax" not in overrides


def test_model_trials_keep_their_identity():
    """The ops keys are not part of a model trial's identity: resume=true still finds rows recorded before."""
    model, ops = composed("scenario=model"), composed("scenario=ops")
    assert not {"scenario", "threads", "ops"} & set(SCENARIOS["model"].identity(model))
    assert set(SCENARIOS["ops"].identity(ops)) == {"scenario", "framework", "device", "dtype", "threads", "seed", "ops"}
    assert hash_of("ops.sizes=[3]") == hash_of("scenario=model")


def test_a_setting_moved_into_its_estimator_reads_and_hashes_as_before():
    """mezo_eps became mezo.eps: a config saved with the old key (a results folder's configs/) reads into the node,
    and a trial's identity keeps the old key, so its recorded hash still matches (the hashes above); a setting that
    came with the node counts only off its default."""
    saved = to_dict(composed("mode=mezo"))
    saved.pop("mezo")
    saved["mezo_eps"] = 0.01
    cfg = from_dict(saved)
    assert (cfg.mezo.eps, cfg.mezo.q) == (0.01, 1)
    identity = SCENARIOS["model"].identity(cfg)
    assert identity["mezo_eps"] == 0.01 and not {"mezo", "mezo_q"} & set(identity)
    assert SCENARIOS["model"].identity(composed("mode=mezo", "mezo.q=4"))["mezo_q"] == 4
    assert hash_of("mode=mezo", "mezo.eps=0.001") == hash_of("mode=mezo") != hash_of("mode=mezo", "mezo.q=2")


def test_jvp_and_jacfwd_settings_moved_into_their_nodes_read_and_hash_as_before():
    """num_tangents, jvp_impl, jvp_tangent, jacfwd_chunk and jacfwd_max_params became jvp.* and jacfwd.*: a saved
    config with the old keys reads into the nodes, and the identity keeps the old keys as they were (jvp_tangent,
    added after rows were recorded, only off auto), so a recorded trial hashes the same."""
    saved = to_dict(composed("mode=jvp"))
    saved.pop("jvp"), saved.pop("jacfwd")
    saved |= {"num_tangents": 4, "jvp_impl": "lazy", "jacfwd_chunk": 16, "jacfwd_max_params": 1000}
    cfg = from_dict(saved)
    assert (cfg.jvp.num_tangents, cfg.jvp.impl, cfg.jvp.tangent) == (4, "lazy", "auto")
    assert (cfg.jacfwd.chunk, cfg.jacfwd.max_params) == (16, 1000)
    identity = SCENARIOS["model"].identity(cfg)
    assert {k: identity[k] for k in ("num_tangents", "jvp_impl", "jacfwd_chunk", "jacfwd_max_params")} == {
        "num_tangents": 4,
        "jvp_impl": "lazy",
        "jacfwd_chunk": 16,
        "jacfwd_max_params": 1000,
    }
    assert not {"jvp", "jacfwd", "jvp_tangent"} & set(identity)
    assert SCENARIOS["model"].identity(composed("mode=jvp", "jvp.tangent=redraw"))["jvp_tangent"] == "redraw"
    assert hash_of("mode=jvp", "jvp.num_tangents=1") == hash_of("mode=jvp") != hash_of("mode=jvp", "jvp.num_tangents=2")


def test_optimizer_defaults_are_the_presets_in_conf():
    for name, defaults in OPTIMIZER_DEFAULTS.items():
        preset = yaml.safe_load((REPO / "conf" / "optimizer" / f"{name}.yaml").read_text())
        for key, value in preset.items():
            column = {"eps": "adam_eps"}.get(key, key)
            if column in defaults:
                assert defaults[column] == pytest.approx(float(value)), (name, key)
    rows = [
        trial("jax", "backprop", optimizer="adamw", lr=5e-5, weight_decay=0.01),
        trial("jax", "backprop", optimizer="adamw"),
    ]  # the preset's values, and an older row without them
    assert context_key(rows[0]) == context_key(rows[1])
