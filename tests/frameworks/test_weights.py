"""The shared weights: seeded init, checkpoint reading, strict loading, exact round trips between frameworks.

Everything that feeds both models goes through one {hf_name: float32 numpy} dict; these tests hold that the
dict survives torch -> jax -> torch bit for bit, that a bad dict is refused with every problem named at once,
and that checkpoints are read without ever unpickling.
"""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

from bench.config import model_preset
from bench.jax_impl.models import bert as jax_bert
from bench.jax_impl.models.bert import BertForSequenceClassification
from bench.jax_impl.models.bert import build_model as jax_build_model
from bench.jax_impl.models.common import is_stacked
from bench.models.bert import count_params, is_trainable, lora_shapes, param_shapes
from bench.spec import TRAINABLE_SCOPES, LoraSpec
from bench.torch_impl.models import bert as torch_bert
from bench.torch_impl.models.common import weights_from_state_dict
from bench.weights import WeightsError, build_weights, init_weights
from tests.support import REPO


def _assert_identical(a: dict[str, np.ndarray], b: dict[str, np.ndarray]):
    """Same names in the same order, same dtypes and shapes, same bytes."""
    assert list(a) == list(b)
    for k in a:
        assert a[k].dtype == b[k].dtype == np.float32, k
        assert a[k].shape == b[k].shape, k
        assert a[k].tobytes() == b[k].tobytes(), k


@pytest.fixture(scope="module", params=["tiny", "minilm_l6"])
def preset(request):
    spec, checkpoint = model_preset(request.param, dropout=0.0)
    return spec, build_weights(spec, 0, checkpoint)


def test_round_trip_torch_jax_torch_is_exact(preset):
    spec, weights = preset
    assert list(weights) == list(param_shapes(spec))
    t1 = torch_bert.build_model(spec, weights)
    from_torch = weights_from_state_dict(t1.state_dict(), spec)  # in-memory torch -> shared dict
    jm = jax_build_model(spec, from_torch)
    from_jax = jax_bert.export_weights(jm)
    _assert_identical(from_jax, weights)  # jax export == input dict, HF order, torch layout
    t2 = torch_bert.build_model(spec, from_jax)
    _assert_identical(torch_bert.export_weights(t2), weights)


def test_export_does_not_alias_the_model():
    spec, _ = model_preset("tiny")
    jm = jax_build_model(spec, init_weights(spec, 0))
    out = jax_bert.export_weights(jm)
    out["classifier.bias"][:] = 7.0
    out["classifier.weight"][:] = 7.0
    again = jax_bert.export_weights(jm)
    assert not again["classifier.bias"].any() and not (again["classifier.weight"] == 7.0).any()


def test_hf_name_covers_every_parameter_and_every_path_spelling():
    spec, _ = model_preset("tiny")
    jm = jax_build_model(spec, init_weights(spec, 0), scan_layers=False)
    names = [jax_bert.hf_name(p) for p, _ in nnx.to_flat_state(nnx.state(jm, nnx.Param))]
    assert sorted(names) == sorted(param_shapes(spec))
    # The same names from jax.tree_util key paths (DictKey / GetAttrKey), as optax masks would see them.
    _, state = nnx.split(jm)
    named = jax.tree_util.tree_map_with_path(lambda p, _: jax_bert.hf_name(p), state)
    tree_names = jax.tree_util.tree_leaves(named)
    assert sorted(tree_names) == sorted(names)
    # scan_layers (the default): a stacked parameter names its first layer, layer_names all of them
    stacked = jax_build_model(spec, init_weights(spec, 0))
    every = [
        n
        for p, v in nnx.to_flat_state(nnx.state(stacked, nnx.Param))
        for n in jax_bert.layer_names(p, v.shape[0] if is_stacked(p) else 1)
    ]
    assert sorted(every) == sorted(names)
    assert jax_bert.hf_name(("bert", "encoder", "layer", 1, "attention", "self", "query", "kernel")) == (
        "bert.encoder.layer.1.attention.self.query.weight"
    )
    with pytest.raises(KeyError, match="no BERT parameter"):
        jax_bert.hf_name(("bert", "encoder", "layer", 0, "attention", "self", "query", "weight"))


@pytest.mark.parametrize("scope", TRAINABLE_SCOPES)
def test_trainable_filter_by_hf_name_matches_spec(scope):
    """How the training steps freeze parameters: an nnx filter on is_trainable(hf_name(path)). Both frameworks
    must select exactly bert.count_params(scope) parameters."""
    spec, _ = model_preset("tiny")
    lora = LoraSpec() if scope == "lora" else None  # the model has adapters under lora only
    jm = jax_build_model(spec, init_weights(spec, 0), lora=lora, scan_layers=False)

    def trainable(path, _):
        return is_trainable(jax_bert.hf_name(path), scope, spec.num_layers, last_k=1)

    _, train, frozen = nnx.split(jm, trainable, ...)
    n_train = sum(v.size for v in jax.tree_util.tree_leaves(train))
    n_frozen = sum(v.size for v in jax.tree_util.tree_leaves(frozen))
    assert n_train == count_params(spec, scope, last_k=1)
    adapters = sum(int(np.prod(s)) for s in lora_shapes(spec, lora).values()) if lora else 0
    assert n_train + n_frozen == count_params(spec) + adapters


def _tiny_checkpoint(spec, seed):
    """A BertModel-style state (no "bert." prefix, no classifier), as the MiniLM package ships it, with HF's
    position_ids buffer and TF-style gamma/beta for one LayerNorm.
    Returns (tensors, {hf_name: checkpoint key})."""
    ckpt, source = {}, {}
    for name, v in init_weights(spec, seed).items():
        if name.startswith("classifier."):
            continue
        k = name.removeprefix("bert.")
        if k.startswith("embeddings.LayerNorm."):
            k = k.replace(".weight", ".gamma").replace(".bias", ".beta")
        ckpt[k] = v + np.float32(0.5) if k.endswith((".bias", ".beta")) else v  # nonzero biases: not an init
        source[name] = k
    ckpt["embeddings.position_ids"] = np.arange(spec.max_position_embeddings, dtype=np.int64)[None]
    return ckpt, source


def test_safetensors_checkpoint_converts(tmp_path):
    from safetensors.numpy import save_file

    spec, _ = model_preset("tiny")
    ckpt, source = _tiny_checkpoint(spec, seed=7)
    save_file(ckpt, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text("{}")  # HF checkpoint dirs hold more than weights; ignored

    weights = build_weights(spec, 0, str(tmp_path))
    assert list(weights) == list(param_shapes(spec))
    seeded = init_weights(spec, 0)
    for k, v in weights.items():
        if k.startswith("classifier."):  # a BertModel checkpoint has no head: it comes from the seeded init
            np.testing.assert_array_equal(v, seeded[k])
        else:
            np.testing.assert_array_equal(v, ckpt[source[k]], err_msg=k)
    # A single .safetensors file reads the same as its directory.
    _assert_identical(build_weights(spec, 0, str(tmp_path / "model.safetensors")), weights)

    jm = jax_build_model(spec, weights)
    out = jax_bert.export_weights(jm)
    _assert_identical(out, weights)
    np.testing.assert_array_equal(  # the layout transform really happened: kernel (in, out) = weight.T
        np.asarray(jm.bert.encoder.stacks["0"].intermediate.dense.kernel[...][1]),  # layer 1 of the one stack
        ckpt["encoder.layer.1.intermediate.dense.weight"].T,
    )


def _bad_weights(spec):
    weights = init_weights(spec, 0)
    del weights["bert.encoder.layer.1.attention.self.key.bias"]
    weights["bert.encoder.layer.9.output.dense.weight"] = np.zeros((2, 2), np.float32)
    weights["bert.pooler.dense.weight"] = weights["bert.pooler.dense.weight"][:, :-1]
    return weights


@pytest.mark.parametrize("framework", ["jax", "torch"])
def test_every_bad_key_reported_together(framework):
    spec, _ = model_preset("tiny")
    weights = _bad_weights(spec)
    if framework == "jax":
        model = nnx.eval_shape(lambda: BertForSequenceClassification(spec, rngs=nnx.Rngs(0)))
        load = jax_bert.load_weights
    else:
        model = torch_bert.build_model(spec, init_weights(spec, 0))
        load = torch_bert.load_weights
    with pytest.raises(WeightsError) as e:
        load(model, weights)
    msg = str(e.value)
    assert "\n" not in msg
    for name in (
        "missing 1: bert.encoder.layer.1.attention.self.key.bias",
        "unexpected 1: bert.encoder.layer.9.output.dense.weight",
        "bert.pooler.dense.weight (32, 31) != (32, 32)",
    ):
        assert name in msg, msg


def test_jax_build_model_refuses_bad_weights():
    spec, _ = model_preset("tiny")
    with pytest.raises(WeightsError, match="missing 1: .*unexpected 1: .*shape mismatch 1"):
        jax_build_model(spec, _bad_weights(spec))


class _Boom:
    """Unpickling this creates a marker file: proof that a loader unpickled."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


@pytest.mark.parametrize("as_dir", [False, True])
def test_bin_checkpoint_refused_without_unpickling(tmp_path, as_dir):
    spec, _ = model_preset("tiny")
    marker = tmp_path / "unpickled"
    ckdir = tmp_path / "ckpt"
    ckdir.mkdir()
    binfile = ckdir / "pytorch_bert.bin"
    binfile.write_bytes(pickle.dumps(_Boom(marker)))
    pickle.loads(binfile.read_bytes())  # the trap works ...
    assert marker.exists()
    marker.unlink()
    target = ckdir if as_dir else binfile
    with pytest.raises(WeightsError) as e:
        build_weights(spec, 0, str(target))
    assert not marker.exists()  # ... and build_weights never sprang it
    msg = str(e.value)
    assert "\n" not in msg and str(target) in msg and "safetensors" in msg


def test_missing_checkpoint_is_one_line_naming_the_path(tmp_path):
    spec, _ = model_preset("tiny")
    path = str(tmp_path / "no" / "such" / "checkpoint")
    with pytest.raises(WeightsError) as e:
        build_weights(spec, 0, path)
    assert "\n" not in str(e.value) and path in str(e.value)


def test_seeded_init_deterministic_and_hf_statistics():
    spec, _ = model_preset("tiny")
    a, b, c = init_weights(spec, 0), init_weights(spec, 0), init_weights(spec, 1)
    _assert_identical(a, b)
    for k in a:
        if a[k].std() > 0:  # random tensors: another seed gives other values
            assert not np.array_equal(a[k], c[k]), k
    # A tensor's values do not depend on which others are generated (a checkpoint can supply the rest).
    np.testing.assert_array_equal(
        init_weights(spec, 0, ["classifier.weight"])["classifier.weight"], a["classifier.weight"]
    )

    std = spec.initializer_range
    for k, w in a.items():
        if ".LayerNorm." in k:
            assert (w == (1.0 if k.endswith(".weight") else 0.0)).all(), k
        elif k.endswith(".bias"):
            assert not w.any(), k
        else:  # Linear / Embedding weights ~ N(0, initializer_range)
            if k == "bert.embeddings.word_embeddings.weight":
                assert not w[spec.pad_token_id].any()
                w = np.delete(w, spec.pad_token_id, axis=0)
            # Sampling error: the std of n normal draws has relative sd 1/sqrt(2n), the mean has sd
            # std/sqrt(n); 5 sd each (a wrong distribution fails by far more on the big tensors; n >= 64
            # everywhere).
            n = w.size
            assert abs(w.std() / std - 1) < 5 / np.sqrt(2 * n), (k, w.std())
            assert abs(w.mean()) < 5 * std / np.sqrt(n), (k, w.mean())


@pytest.mark.slow
def test_jax_impl_never_imports_torch():
    """A JAX trial process must not pay for (or be perturbed by) torch: build and run without importing it."""
    code = (
        "import sys\n"
        "from bench.config import model_preset\n"
        "from bench.weights import build_weights\n"
        "from bench.jax_impl.models.bert import build_model, export_weights\n"
        "spec, ck = model_preset('tiny')\n"
        "m = build_model(spec, build_weights(spec, 0, ck))\n"
        "export_weights(m)\n"
        "bad = sorted(k for k in sys.modules if k.split('.')[0] in ('torch', 'transformers'))\n"
        "assert not bad, bad[:5]\n"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]


def _sharded(tmp_path, spec, weight_map_of=None):
    """The tiny checkpoint as an HF sharded folder: its index and one shard file."""
    from safetensors.numpy import save_file

    ckpt, _ = _tiny_checkpoint(spec, seed=1)
    save_file(ckpt, str(tmp_path / "model-00001-of-00001.safetensors"))
    weight_map = {k: "model-00001-of-00001.safetensors" for k in ckpt}
    return ckpt, weight_map if weight_map_of is None else weight_map_of(weight_map)


@pytest.mark.parametrize(
    "index, message",
    [
        ("{not json", "model.safetensors.index.json: not readable JSON (JSONDecodeError)"),
        ("[1, 2]", "model.safetensors.index.json: not a JSON object"),
        ('{"metadata": {}}', "model.safetensors.index.json: no weight_map of tensor -> shard file"),
        ('{"weight_map": [1]}', "model.safetensors.index.json: no weight_map of tensor -> shard file"),
        (b"\xff\xfe\x00", "model.safetensors.index.json: not readable JSON ("),
    ],
)
def test_a_damaged_checkpoint_index_is_one_line(tmp_path, index, message):
    from bench.weights import check_checkpoint

    spec, _ = model_preset("tiny")
    _sharded(tmp_path, spec)
    path = tmp_path / "model.safetensors.index.json"
    path.write_bytes(index) if isinstance(index, bytes) else path.write_text(index)
    with pytest.raises(WeightsError, match="^model.checkpoint=") as e:
        check_checkpoint(str(tmp_path), spec)
    assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("shard", ["/etc/passwd", "../outside.safetensors", "sub/model.safetensors", ".."])
def test_a_checkpoint_index_names_shards_inside_its_folder_only(tmp_path, shard):
    import json

    from safetensors.numpy import save_file

    from bench.weights import check_checkpoint

    spec, _ = model_preset("tiny")
    folder = tmp_path / "ckpt"
    (folder / "sub").mkdir(parents=True)
    ckpt, weight_map = _sharded(folder, spec)
    save_file(ckpt, str(tmp_path / "outside.safetensors"))  # a real file there: refused by its name, not its absence
    save_file(ckpt, str(folder / "sub" / "model.safetensors"))
    weight_map["embeddings.word_embeddings.weight"] = shard
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    for check in (check_checkpoint, build_weights):
        with pytest.raises(WeightsError, match=f"shard '{shard}' is not a .safetensors file name in the checkpoint"):
            check(str(folder), spec) if check is check_checkpoint else check(spec, 0, str(folder))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_checkpoint_with_a_non_finite_weight_is_refused_naming_the_tensor(tmp_path, bad):
    from safetensors.numpy import save_file

    from bench.weights import check_checkpoint

    spec, _ = model_preset("tiny")
    ckpt, _ = _tiny_checkpoint(spec, seed=1)
    ckpt["encoder.layer.1.output.dense.weight"][0, 3] = bad
    save_file(ckpt, str(tmp_path / "model.safetensors"))
    with pytest.raises(WeightsError, match=r"in 1 tensor\(s\): encoder.layer.1.output.dense.weight \(1\)"):
        check_checkpoint(str(tmp_path), spec)  # preflight, before any trial
    # and a file changed after preflight: the trial's load ends in an error naming it, never a diverged run
    with pytest.raises(WeightsError, match="tensor bert.encoder.layer.1.output.dense.weight holds 1 non-finite"):
        build_weights(spec, 0, str(tmp_path))
