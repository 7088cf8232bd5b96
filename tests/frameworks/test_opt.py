"""OPT in both frameworks computes the same function from the same weights: HF's PyTorch OPTForSequenceClassification
against our NNX one (bench/jax_impl/models/opt.py), on OPT_TINY with seeded weights, fp32 with matmul precision
pinned, dropout off, on a right-padded batch (pad_token_id, rows of different lengths, one row without padding).

- the family's facts (bench/models/opt.py): HF's names, shapes and count for opt-125m, HF's init, the scopes;
- weights load and export exactly in both frameworks (adapters too);
- the same logits, hidden states and loss; the same gradient of the loss over every parameter (reverse mode) and
  the same directional derivative (forward mode: jax.jvp against torch.func.jvp);
- padding changes nothing; head(features(x)) is the model, and jacfwd over the head is its gradient;
- LoRA (PEFT's q_proj/v_proj): the same loss and the same gradients of the adapters and the score.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
from flax import nnx
from torch.func import functional_call, jvp
from transformers import OPTForSequenceClassification

from bench.jax_impl.models import opt as jax_opt
from bench.models.opt import (
    OPT_125M,
    OPT_TINY,
    count_params,
    init_weights,
    is_trainable,
    lora_shapes,
    param_shapes,
)
from bench.spec import LoraSpec
from bench.torch_impl.models import opt as torch_opt
from tests.support import trained_adapters

SPEC = OPT_TINY
WEIGHTS = init_weights(SPEC, 0)
PAD = SPEC.pad_token_id
LENGTHS = (12, 9, 5, 2)  # the first row has no padding
T = 12
QV = LoraSpec(rank=4, alpha=8.0)  # PEFT's OPT targets (BERT's query/value, read as their roles)
# Forward: float32 rounding (eps 1.2e-7) of O(1) activations through two layers stays near 1e-7;
# 1e-5 still catches a wrong mask, position offset or pooled token (each moves these logits far more).
ATOL = 1e-5
# Gradients: rtol 1e-4 (the suite's parity tolerance, tests/frameworks/test_parity.py), with an atol for entries
# near zero where a relative test means nothing: GRAD_ATOL for the key projections' biases, whose gradient is
# analytically zero (softmax ignores a per-row shift) so both frameworks return rounding noise there, and
# SCALE_ATOL of the tensor's largest entry for entries that are sums cancelling to far below their terms (float32
# rounds such a sum to ~1e-7 of its terms' scale; the score's gradient has such entries).
RTOL, GRAD_ATOL, SCALE_ATOL = 1e-4, 1e-8, 1e-6


pytestmark = pytest.mark.usefixtures("fp32_pinned")  # tests/frameworks/conftest.py


def make_batch(lengths=LENGTHS, seed=0):
    """Right-padded with pad_token_id, attention_mask 1 on the tokens; ids drawn apart from the pad id."""
    rng = np.random.default_rng(seed)
    ids = np.full((len(lengths), T), PAD, np.int32)
    mask = np.zeros_like(ids)
    for b, n in enumerate(lengths):
        ids[b, :n] = rng.integers(PAD + 1, SPEC.vocab_size, n)
        mask[b, :n] = 1
    labels = rng.integers(0, SPEC.num_labels, len(lengths)).astype(np.int32)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


BATCH = make_batch()


def torch_inputs(batch):
    return {k: torch.tensor(v, dtype=torch.long) for k, v in batch.items()}


def jax_loss_fn(model):
    """(loss_of(params), params): the mean cross-entropy of the pooled logits, as the trainers compute it."""
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def loss_of(params, batch):
        logits = nnx.merge(graphdef, params, rest)(batch["input_ids"], batch["attention_mask"])
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch["labels"]).mean()

    return loss_of, params


def assert_grads_close(got: dict, want: dict, what: str):
    assert sorted(got) == sorted(want), what
    for name, w in want.items():
        atol = max(GRAD_ATOL, SCALE_ATOL * float(np.abs(w).max()))
        np.testing.assert_allclose(got[name], w, rtol=RTOL, atol=atol, err_msg=f"{what}: {name}")


@pytest.fixture(scope="module")
def models():
    return torch_opt.build_model(SPEC, WEIGHTS).eval(), jax_opt.build_model(SPEC, WEIGHTS)


# ---------------------------------------------------------------------------------------------------------------
# the family's facts


def test_param_shapes_are_hfs_for_opt_125m():
    # On the meta device: HF's names, order and shapes at opt-125m's size, without allocating its weights.
    with torch.device("meta"):
        hf = OPTForSequenceClassification(torch_opt.hf_config(OPT_125M))
    assert {n: tuple(p.shape) for n, p in hf.named_parameters()} == param_shapes(OPT_125M)
    assert [n for n, _ in hf.named_parameters()] == list(param_shapes(OPT_125M))
    assert count_params(OPT_125M) == sum(p.numel() for p in hf.parameters())
    assert param_shapes(OPT_125M)["model.decoder.embed_positions.weight"] == (2048 + 2, 768)  # HF's offset of 2


def test_init_weights_as_hf_initialises():
    again, other = init_weights(SPEC, 0), init_weights(SPEC, 1)
    assert all(np.array_equal(WEIGHTS[k], again[k]) for k in WEIGHTS)  # deterministic by seed
    emb = WEIGHTS["model.decoder.embed_tokens.weight"]
    assert not emb[PAD].any() and emb[PAD + 1].any()  # padding_idx's row is zero
    assert not np.array_equal(emb, other["model.decoder.embed_tokens.weight"])
    assert WEIGHTS["model.decoder.final_layer_norm.weight"].min() == 1
    assert not WEIGHTS["model.decoder.layers.0.fc1.bias"].any()
    assert np.std(emb) == pytest.approx(SPEC.init_std, rel=0.05)  # 32k draws: the std within a few percent


def test_trainable_scopes():
    names, L = list(param_shapes(SPEC)), SPEC.num_layers
    picked = lambda scope, **kw: [n for n in names if is_trainable(n, scope, L, **kw)]
    assert picked("all") == names
    head = ["model.decoder.final_layer_norm.weight", "model.decoder.final_layer_norm.bias", "score.weight"]
    assert picked("head") == head
    assert picked("classifier") == ["score.weight"]
    assert picked("lora") == ["score.weight"]
    bias = picked("bias")
    assert "score.weight" in bias and "model.decoder.layers.0.self_attn_layer_norm.bias" in bias
    assert all(n.endswith(".bias") for n in bias if n != "score.weight")
    last = picked("last_k", last_k=1)
    assert set(head) < set(last) and all("layers.0." not in n for n in last) and any("layers.1." in n for n in last)
    shapes = lora_shapes(SPEC, QV)
    assert list(shapes)[:2] == [
        "model.decoder.layers.0.self_attn.q_proj.lora_A.weight",
        "model.decoder.layers.0.self_attn.q_proj.lora_B.weight",
    ]
    assert len(shapes) == 2 * 2 * L and all(is_trainable(n, "lora", L) for n in shapes)
    H, r = SPEC.hidden_size, QV.rank
    assert count_params(SPEC, "lora", lora=QV) == 2 * L * 2 * r * H + SPEC.num_labels * H


# ---------------------------------------------------------------------------------------------------------------
# weights


def test_weights_load_and_export_exactly(models):
    for exported in (torch_opt.export_weights(models[0]), jax_opt.export_weights(models[1])):
        assert sorted(exported) == sorted(WEIGHTS)
        assert all(exported[k].tobytes() == v.tobytes() for k, v in WEIGHTS.items())
    broken = {k: v for k, v in WEIGHTS.items() if k != "score.weight"}
    broken["model.decoder.layers.0.fc1.weight"] = WEIGHTS["model.decoder.layers.0.fc1.weight"].T
    for build in (torch_opt.build_model, jax_opt.build_model):
        with pytest.raises(ValueError, match=r"missing 1: score.weight .*shape mismatch 1: .*fc1.weight"):
            build(SPEC, broken)


# ---------------------------------------------------------------------------------------------------------------
# forward and reverse mode


@pytest.mark.slow
def test_same_logits_hidden_states_and_loss(models):
    tm, jm = models
    with torch.no_grad():
        out = tm(**torch_inputs(BATCH), output_hidden_states=True)
    logits, hidden = jm(BATCH["input_ids"], BATCH["attention_mask"], output_hidden_states=True)
    np.testing.assert_allclose(np.asarray(logits), out.logits.numpy(), rtol=0, atol=ATOL)
    # HF's hidden_states: the embeddings, each layer's output, the last one after the final LayerNorm
    final = jm.model.decoder.final_layer_norm(hidden[-1])
    for i, (h_j, h_t) in enumerate(zip((*hidden[:-1], final), out.hidden_states, strict=True)):
        np.testing.assert_allclose(np.asarray(h_j), h_t.numpy(), rtol=0, atol=ATOL, err_msg=f"hidden state {i}")
    loss_of, params = jax_loss_fn(jm)
    assert abs(float(loss_of(params, BATCH)) - out.loss.item()) <= ATOL


@pytest.fixture(scope="module")
def torch_grads(models):
    tm = models[0]
    tm.zero_grad()
    loss = tm(**torch_inputs(BATCH)).loss
    loss.backward()
    return loss.item(), {n: p.grad.numpy().copy() for n, p in tm.named_parameters()}


@pytest.mark.slow
def test_same_gradients(models, torch_grads):
    loss_of, params = jax_loss_fn(models[1])
    loss, grads = jax.jit(jax.value_and_grad(loss_of))(params, BATCH)
    assert abs(float(loss) - torch_grads[0]) <= ATOL
    assert_grads_close(jax_opt.to_hf(grads), torch_grads[1], "grad")
    assert np.abs(torch_grads[1]["model.decoder.layers.0.fc2.weight"]).max() > 1e-4  # the test sees real gradients


@pytest.mark.slow
def test_stacks_and_remat_change_nothing(models, torch_grads):
    """trainable=last_k's two stacks (bench.jax_impl.models.common.layer_stacks), remat inside the scan: the same
    loss and gradients; each stack is trained or frozen whole, and a scope that splits one is refused."""
    split = jax_opt.build_model(SPEC, WEIGHTS, remat=True, stacks=(1, 1))
    loss_of, params = jax_loss_fn(split)
    loss, grads = jax.jit(jax.value_and_grad(loss_of))(params, BATCH)
    assert abs(float(loss) - torch_grads[0]) <= ATOL
    assert_grads_close(jax_opt.to_hf(grads), torch_grads[1], "remat, two stacks")
    trained = {
        jax_opt.hf_name(path)
        for path, x in nnx.to_flat_state(params)
        if jax_opt.is_trained(path, x, "last_k", SPEC.num_layers, last_k=1)
    }
    # stacks of one layer each: a stacked parameter's hf_name (its first layer's) names it exactly
    assert trained == {n for n in WEIGHTS if is_trainable(n, "last_k", SPEC.num_layers, 1)}
    path, x = next((p, x) for p, x in nnx.to_flat_state(nnx.state(models[1], nnx.Param)) if "fc1" in jax_opt.hf_name(p))
    with pytest.raises(ValueError, match="layer_stacks"):
        jax_opt.is_trained(path, x, "last_k", SPEC.num_layers, last_k=1)


@pytest.mark.slow
def test_unrolled_layers_are_the_same_model_with_no_loop_left(torch_grads):
    """scan_layers=false: each layer a stack of one, whose one-trip scan XLA inlines: the compiled step holds no
    while loop, where the scanned model's holds one, and the loss and gradients are the same."""
    programs = {}
    for scan in (True, False):
        loss_of, params = jax_loss_fn(jax_opt.build_model(SPEC, WEIGHTS, scan_layers=scan))
        step = jax.jit(jax.value_and_grad(loss_of))
        programs[scan] = step.lower(params, BATCH).compile().as_text()
        loss, grads = step(params, BATCH)
        assert abs(float(loss) - torch_grads[0]) <= ATOL
        assert_grads_close(jax_opt.to_hf(grads), torch_grads[1], f"scan_layers={scan}")
    assert " while(" in programs[True] and " while(" not in programs[False]


def test_same_directional_derivative_forward_mode(models, torch_grads):
    """jax.jvp and torch.func.jvp of the loss along one tangent over every parameter: this suite's forward
    gradient. Both equal grad . v by reverse mode, within the gradients' tolerance."""
    tm, jm = models
    rng = np.random.default_rng(1)
    tangent = {k: rng.standard_normal(v.shape).astype(np.float32) for k, v in WEIGHTS.items()}
    params_t = {n: p.detach() for n, p in tm.named_parameters()}
    inputs = torch_inputs(BATCH)
    loss_t = lambda p: functional_call(tm, p, args=(), kwargs=inputs).loss
    _, d_t = jvp(loss_t, (params_t,), ({n: torch.from_numpy(tangent[n]) for n in params_t},))
    loss_of, params = jax_loss_fn(jm)
    _, d_j = jax.jit(lambda p, v: jax.jvp(lambda q: loss_of(q, BATCH), (p,), (v,)))(
        params, jax_opt.from_hf(params, tangent)
    )
    exact = sum(float(np.vdot(torch_grads[1][k], tangent[k])) for k in tangent)
    scale = sum(float(np.abs(torch_grads[1][k] * tangent[k]).sum()) for k in tangent)  # the sum's conditioning
    assert abs(float(d_j) - d_t.item()) <= RTOL * scale
    assert abs(d_t.item() - exact) <= RTOL * scale


# ---------------------------------------------------------------------------------------------------------------
# padding, the head, dropout


@pytest.mark.slow
def test_padding_changes_nothing(models):
    """Each padded row gives the logits it gives alone, unpadded; and what the pad token embeds is never read.
    (A padded position's id cannot become another token without moving the pooled position: HF reads the logits
    at the rightmost id that is not pad_token_id.)"""
    tm, jm = models
    logits = np.asarray(jm(BATCH["input_ids"], BATCH["attention_mask"]))
    for b, n in enumerate(LENGTHS):
        alone = {k: BATCH[k][b : b + 1, :n] for k in ("input_ids", "attention_mask")}
        np.testing.assert_allclose(np.asarray(jm(**alone))[0], logits[b], rtol=0, atol=ATOL, err_msg=f"row {b}")
        with torch.no_grad():
            alone_t = tm(**torch_inputs(alone)).logits.numpy()[0]
        np.testing.assert_allclose(alone_t, logits[b], rtol=0, atol=ATOL, err_msg=f"torch row {b}")
    noisy = dict(WEIGHTS)
    noisy["model.decoder.embed_tokens.weight"] = WEIGHTS["model.decoder.embed_tokens.weight"].copy()
    noisy["model.decoder.embed_tokens.weight"][PAD] = 1.0
    again = jax_opt.build_model(SPEC, noisy)(BATCH["input_ids"], BATCH["attention_mask"])
    np.testing.assert_array_equal(np.asarray(again), logits)


@pytest.mark.slow
def test_head_of_features_is_the_model_and_jacfwd_its_gradient(models):
    jm = models[1]
    ids, mask = BATCH["input_ids"], BATCH["attention_mask"]
    hidden = jm.features(ids, mask)  # (B, T, H), before the final LayerNorm
    np.testing.assert_array_equal(np.asarray(jm.head(hidden, ids)), np.asarray(jm(ids, mask)))
    # trainable=head: the head's parameters (final LayerNorm + score) alone, the trunk's output a constant
    head_only = nnx.All(nnx.Param, lambda path, x: is_trainable(jax_opt.hf_name(path), "head", SPEC.num_layers))
    graphdef, head, rest = nnx.split(jm, head_only, ...)

    def loss_of(head):
        logits = nnx.merge(graphdef, head, rest).head(hidden, ids)
        return optax.softmax_cross_entropy_with_integer_labels(logits, BATCH["labels"]).mean()

    assert sorted(jax_opt.to_hf(head)) == sorted(n for n in WEIGHTS if is_trainable(n, "head", SPEC.num_layers))
    by_jacfwd, by_grad = jax.jacfwd(loss_of)(head), jax.grad(loss_of)(head)
    for a, b in zip(jax.tree.leaves(by_jacfwd), jax.tree.leaves(by_grad), strict=True):
        np.testing.assert_allclose(a, b, rtol=RTOL, atol=GRAD_ATOL)


@pytest.mark.slow
def test_dropout_only_with_rngs():
    spec = OPT_TINY  # dropout 0.1 by default
    model = jax_opt.build_model(spec, WEIGHTS)
    args = (BATCH["input_ids"], BATCH["attention_mask"])
    key = lambda k: nnx.Rngs(dropout=jax.random.key(k, impl="rbg"))  # rbg: cheap to compile on CPU
    train = lambda k: np.asarray(model(*args, deterministic=False, rngs=key(k)))
    np.testing.assert_array_equal(train(1), train(1))
    assert not np.allclose(train(1), train(2)) and not np.allclose(train(1), model(*args))
    with pytest.raises(ValueError, match="rngs"):
        model(*args, deterministic=False)


# ---------------------------------------------------------------------------------------------------------------
# LoRA


@pytest.mark.slow
@pytest.mark.parametrize(
    "lora", [QV, LoraSpec(rank=2, alpha=3.0, targets=("k_proj", "out_proj", "fc1", "fc2"))], ids=["qv", "others"]
)
def test_lora_same_loss_and_adapter_gradients(lora):
    weights = {**WEIGHTS, **trained_adapters(SPEC, lora)}
    tm, jm = torch_opt.build_model(SPEC, weights, lora=lora).eval(), jax_opt.build_model(SPEC, weights, lora=lora)
    names = [n for n, _ in tm.named_parameters()]
    assert "model.decoder.layers.0.self_attn.q_proj.lora_A.default.weight" in names or lora is not QV
    for exported in (torch_opt.export_weights(tm), jax_opt.export_weights(jm)):
        assert sorted(exported) == sorted(param_shapes(SPEC, lora))
        assert all(exported[k].tobytes() == v.tobytes() for k, v in weights.items())

    trained = lambda n: is_trainable(n, "lora", SPEC.num_layers)
    for p in tm.parameters():  # PEFT leaves only its adapters requiring grad; the score trains too
        p.requires_grad_(True)
    loss_t = tm(**torch_inputs(BATCH)).loss
    loss_t.backward()
    grads_t = {torch_opt.hf_name(n): p.grad.numpy() for n, p in tm.named_parameters() if trained(torch_opt.hf_name(n))}
    loss_of, params = jax_loss_fn(jm)
    loss_j, grads_j = jax.jit(jax.value_and_grad(loss_of))(params, BATCH)
    assert abs(float(loss_j) - loss_t.item()) <= ATOL
    assert_grads_close({k: v for k, v in jax_opt.to_hf(grads_j).items() if trained(k)}, grads_t, "lora grad")
    assert len(grads_t) == len(lora_shapes(SPEC, lora)) + 1  # the adapters and the score


@pytest.mark.slow
def test_drawn_adapters_leave_the_model_its_base(models):
    logits = jax_opt.build_model(SPEC, WEIGHTS, lora=QV, seed=3)(BATCH["input_ids"], BATCH["attention_mask"])
    np.testing.assert_array_equal(
        np.asarray(logits), np.asarray(models[1](BATCH["input_ids"], BATCH["attention_mask"]))
    )
    with torch.no_grad():
        t = torch_opt.build_model(SPEC, WEIGHTS, lora=QV, seed=3).eval()(**torch_inputs(BATCH)).logits
        assert torch.equal(t, models[0](**torch_inputs(BATCH)).logits)
    assert jnp.asarray(logits).dtype == jnp.float32
