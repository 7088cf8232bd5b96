"""LLaMA in both frameworks computes the same function from the same weights: HF's PyTorch
LlamaForSequenceClassification against our NNX one (bench/jax_impl/models/llama.py), on LLAMA_TINY (4 heads over 2
key-value heads) with seeded weights, fp32 with matmul precision pinned, on a right-padded batch (pad_token_id,
rows of different lengths, one row without padding).

- the family's facts (bench/models/llama.py): HF's names, shapes and count at SmolLM2-135M's size, HF's init, the
  scopes, the config's checks;
- weights load and export exactly in both frameworks (adapters too);
- the same logits, hidden states and loss; the same gradient of the loss over every parameter (reverse mode) and
  the same directional derivative (forward mode: jax.jvp against torch.func.jvp);
- padding changes nothing; head(features(x)) is the model, and jacfwd over the head is its gradient;
- LoRA (PEFT's q_proj/v_proj, and the other five): the same loss and the same gradients of the adapters and score.
"""

from __future__ import annotations

import jax
import numpy as np
import optax
import pytest
import torch
from flax import nnx
from torch.func import functional_call, jvp
from transformers import LlamaForCausalLM, LlamaForSequenceClassification, LlamaModel

from bench.config import model_preset
from bench.errors import ConfigError
from bench.jax_impl.models import llama as jax_llama
from bench.models.llama import (
    LLAMA_TINY,
    SMOLLM2_135M,
    checkpoint_name,
    count_params,
    init_weights,
    is_trainable,
    lora_shapes,
    param_shapes,
)
from bench.spec import LoraSpec
from bench.torch_impl.models import llama as torch_llama
from bench.weights import build_weights, check_checkpoint
from tests.support import trained_adapters

SPEC = LLAMA_TINY
WEIGHTS = init_weights(SPEC, 0)
PAD = SPEC.pad_token_id
LENGTHS = (12, 9, 5, 2)  # the first row has no padding
T = 12
QV = LoraSpec(rank=4, alpha=8.0)  # PEFT's LLaMA targets (BERT's query/value, read as their roles)
# Forward: float32 rounding (eps 1.2e-7) of O(1) activations through two layers stays near 1e-7; 1e-5 still
# catches a wrong mask, rotary layout, key-value grouping or pooled token (each moves these logits far more).
ATOL = 1e-5
# Gradients: the suite's parity tolerance (tests/frameworks/test_parity.py), as test_opt.py's: an atol for entries
# near zero, and one of the tensor's largest entry for sums cancelling to far below their terms.
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
    return torch_llama.build_model(SPEC, WEIGHTS).eval(), jax_llama.build_model(SPEC, WEIGHTS)


# ---------------------------------------------------------------------------------------------------------------
# the family's facts


def test_param_shapes_are_hfs_at_smollm2_135m():
    # On the meta device: HF's names, order and shapes at SmolLM2-135M's size, without allocating its weights.
    with torch.device("meta"):
        hf = LlamaForSequenceClassification(torch_llama.hf_config(SMOLLM2_135M))
    assert {n: tuple(p.shape) for n, p in hf.named_parameters()} == param_shapes(SMOLLM2_135M)
    assert [n for n, _ in hf.named_parameters()] == list(param_shapes(SMOLLM2_135M))
    assert count_params(SMOLLM2_135M) == sum(p.numel() for p in hf.parameters())
    # SmolLM2-135M's 134,515,008 parameters (its LM head tied to the embeddings) and the score's 4 x 576
    assert count_params(SMOLLM2_135M) == 134_515_008 + 4 * 576
    assert param_shapes(SMOLLM2_135M)["model.layers.0.self_attn.k_proj.weight"] == (3 * 64, 576)  # 3 kv heads
    assert model_preset("smollm2_135m")[0] == SMOLLM2_135M


def test_init_weights_as_hf_initialises():
    again, other = init_weights(SPEC, 0), init_weights(SPEC, 1)
    assert all(np.array_equal(WEIGHTS[k], again[k]) for k in WEIGHTS)  # deterministic by seed
    emb = WEIGHTS["model.embed_tokens.weight"]
    assert not emb[PAD].any() and emb[PAD + 1].any()  # padding_idx's row is zero
    assert not np.array_equal(emb, other["model.embed_tokens.weight"])
    assert WEIGHTS["model.norm.weight"].min() == 1 and WEIGHTS["model.layers.1.input_layernorm.weight"].min() == 1
    assert np.std(emb) == pytest.approx(SPEC.initializer_range, rel=0.05)  # 32k draws: the std within a few percent
    assert not any(n.endswith(".bias") for n in WEIGHTS)  # LLaMA has no bias


def test_trainable_scopes():
    names, L = list(param_shapes(SPEC)), SPEC.num_layers
    picked = lambda scope, **kw: [n for n in names if is_trainable(n, scope, L, **kw)]
    assert picked("all") == names
    assert picked("head") == ["model.norm.weight", "score.weight"]
    assert picked("classifier") == picked("lora") == picked("bias") == ["score.weight"]  # no bias to BitFit
    last = picked("last_k", last_k=1)
    assert {"model.norm.weight", "score.weight"} < set(last) and all("layers.0." not in n for n in last)
    assert any("layers.1." in n for n in last)
    shapes = lora_shapes(SPEC, QV)
    assert list(shapes)[:2] == [
        "model.layers.0.self_attn.q_proj.lora_A.weight",
        "model.layers.0.self_attn.q_proj.lora_B.weight",
    ]
    H, r, KV = SPEC.hidden_size, QV.rank, SPEC.kv_heads * SPEC.head_dim
    assert shapes["model.layers.0.self_attn.v_proj.lora_B.weight"] == (KV, r)  # v_proj's width is the kv heads'
    assert len(shapes) == 2 * 2 * L and all(is_trainable(n, "lora", L) for n in shapes)
    assert count_params(SPEC, "lora", lora=QV) == L * (2 * r * H + r * (H + KV)) + SPEC.num_labels * H
    every = lora_shapes(SPEC, LoraSpec(targets=("intermediate.dense",)))  # BERT's role: SwiGLU's two inputs
    assert sorted({n.split(".")[4] for n in every}) == ["gate_proj", "up_proj"]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"num_key_value_heads": 3}, r"^model.num_key_value_heads=3: accepted null or an integer >= 1 dividing"),
        ({"hidden_size": 36, "num_heads": 12}, r"^model.hidden_size=36: accepted a multiple of 2 \* model.num_heads"),
        ({"rope_theta": 0.0}, r"^model.rope_theta=0.0: accepted a finite number > 0$"),
        ({"rms_norm_eps": -1e-6}, r"^model.rms_norm_eps=-1e-06: accepted a finite number > 0$"),
    ],
)
def test_a_value_llama_cannot_take_is_refused_in_one_line(override, message):
    with pytest.raises(ConfigError, match=message):
        model_preset("llama_tiny", **override)
    with pytest.raises(ConfigError, match=r"^model.rope_theta=5.0: a field of model.family=llama, not of opt$"):
        model_preset("opt_tiny", rope_theta=5.0)


# ---------------------------------------------------------------------------------------------------------------
# weights


def test_weights_load_and_export_exactly(models):
    for exported in (torch_llama.export_weights(models[0]), jax_llama.export_weights(models[1])):
        assert sorted(exported) == sorted(WEIGHTS)
        assert all(exported[k].tobytes() == v.tobytes() for k, v in WEIGHTS.items())
    broken = {k: v for k, v in WEIGHTS.items() if k != "score.weight"}
    broken["model.layers.0.mlp.gate_proj.weight"] = WEIGHTS["model.layers.0.mlp.gate_proj.weight"].T
    for build in (torch_llama.build_model, jax_llama.build_model):
        with pytest.raises(ValueError, match=r"missing 1: score.weight .*shape mismatch 1: .*gate_proj.weight"):
            build(SPEC, broken)


@pytest.mark.parametrize("hf_class", [LlamaForCausalLM, LlamaModel])
def test_a_causal_lm_or_trunk_checkpoint_is_read_with_the_score_seeded(tmp_path, hf_class):
    """HF's own LlamaForCausalLM (its tied lm_head left out: a classifier has none) and LlamaModel (keys without
    "model."), saved by save_pretrained: every weight read from the checkpoint, the score seeded."""
    config = torch_llama.hf_config(SPEC)
    config.tie_word_embeddings = True  # SmolLM2's
    torch.manual_seed(0)
    saved = hf_class(config)
    saved.save_pretrained(tmp_path)
    expected = {checkpoint_name(k): v.numpy() for k, v in saved.state_dict().items() if "lm_head" not in k}
    check_checkpoint(str(tmp_path), SPEC)
    weights = build_weights(SPEC, 5, str(tmp_path))
    assert list(weights) == list(WEIGHTS) and sorted(expected) == sorted(n for n in WEIGHTS if n != "score.weight")
    for name, w in expected.items():
        np.testing.assert_array_equal(weights[name], w, err_msg=name)
    np.testing.assert_array_equal(weights["score.weight"], init_weights(SPEC, 5, ["score.weight"])["score.weight"])


# ---------------------------------------------------------------------------------------------------------------
# forward and reverse mode


@pytest.mark.slow
def test_same_logits_hidden_states_and_loss(models):
    tm, jm = models
    with torch.no_grad():
        out = tm(**torch_inputs(BATCH), output_hidden_states=True)
    logits, hidden = jm(BATCH["input_ids"], BATCH["attention_mask"], output_hidden_states=True)
    np.testing.assert_allclose(np.asarray(logits), out.logits.numpy(), rtol=0, atol=ATOL)
    # HF's hidden_states: the embeddings, each layer's output, the last one after the final RMSNorm
    final = jm.model.norm(hidden[-1])
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
    assert_grads_close(jax_llama.to_hf(grads), torch_grads[1], "grad")
    assert np.abs(torch_grads[1]["model.layers.0.mlp.down_proj.weight"]).max() > 1e-4  # real gradients


@pytest.mark.slow
def test_stacks_remat_and_unrolled_layers_change_nothing(torch_grads):
    """trainable=last_k's two stacks with remat inside the scan, and scan_layers=false (each layer a stack of one,
    whose one-trip scan XLA inlines: no loop left in the compiled step, where the scanned model's has one): the same
    loss and gradients."""
    layouts = {
        "scanned": {},
        "remat, two stacks": {"remat": True, "stacks": (1, 1)},
        "unrolled": {"scan_layers": False},
    }
    programs = {}
    for what, kw in layouts.items():
        loss_of, params = jax_loss_fn(jax_llama.build_model(SPEC, WEIGHTS, **kw))
        step = jax.jit(jax.value_and_grad(loss_of))
        programs[what] = step.lower(params, BATCH).compile().as_text()
        loss, grads = step(params, BATCH)
        assert abs(float(loss) - torch_grads[0]) <= ATOL
        assert_grads_close(jax_llama.to_hf(grads), torch_grads[1], what)
    assert " while(" in programs["scanned"] and " while(" not in programs["unrolled"]


@pytest.mark.slow
def test_same_directional_derivative_forward_mode(models, torch_grads):
    """jax.jvp and torch.func.jvp of the loss along one tangent over every parameter: this suite's forward
    gradient (eager attention: SDPA has no forward-mode rule). Both equal grad . v by reverse mode."""
    tm, jm = models
    rng = np.random.default_rng(1)
    tangent = {k: rng.standard_normal(v.shape).astype(np.float32) for k, v in WEIGHTS.items()}
    params_t = {n: p.detach() for n, p in tm.named_parameters()}
    inputs = torch_inputs(BATCH)
    loss_t = lambda p: functional_call(tm, p, args=(), kwargs=inputs).loss
    _, d_t = jvp(loss_t, (params_t,), ({n: torch.from_numpy(tangent[n]) for n in params_t},))
    loss_of, params = jax_loss_fn(jm)
    _, d_j = jax.jit(lambda p, v: jax.jvp(lambda q: loss_of(q, BATCH), (p,), (v,)))(
        params, jax_llama.from_hf(params, tangent)
    )
    exact = sum(float(np.vdot(torch_grads[1][k], tangent[k])) for k in tangent)
    scale = sum(float(np.abs(torch_grads[1][k] * tangent[k]).sum()) for k in tangent)  # the sum's conditioning
    assert abs(float(d_j) - d_t.item()) <= RTOL * scale
    assert abs(d_t.item() - exact) <= RTOL * scale


# ---------------------------------------------------------------------------------------------------------------
# padding, the head


@pytest.mark.slow
def test_padding_changes_nothing(models):
    """Each padded row gives the logits it gives alone, unpadded, in both frameworks; and what the pad token embeds
    is never read."""
    tm, jm = models
    logits = np.asarray(jm(BATCH["input_ids"], BATCH["attention_mask"]))
    for b, n in enumerate(LENGTHS):
        alone = {k: BATCH[k][b : b + 1, :n] for k in ("input_ids", "attention_mask")}
        np.testing.assert_allclose(np.asarray(jm(**alone))[0], logits[b], rtol=0, atol=ATOL, err_msg=f"row {b}")
        with torch.no_grad():
            alone_t = tm(**torch_inputs(alone)).logits.numpy()[0]
        np.testing.assert_allclose(alone_t, logits[b], rtol=0, atol=ATOL, err_msg=f"torch row {b}")
    noisy = dict(WEIGHTS)
    noisy["model.embed_tokens.weight"] = WEIGHTS["model.embed_tokens.weight"].copy()
    noisy["model.embed_tokens.weight"][PAD] = 1.0
    again = jax_llama.build_model(SPEC, noisy)(BATCH["input_ids"], BATCH["attention_mask"])
    np.testing.assert_array_equal(np.asarray(again), logits)


@pytest.mark.slow
def test_head_of_features_is_the_model_in_both_and_jacfwd_its_gradient(models):
    tm, jm = models
    ids, mask = BATCH["input_ids"], BATCH["attention_mask"]
    hidden = jm.features(ids, mask)  # (B, T, H), before the final RMSNorm
    np.testing.assert_array_equal(np.asarray(jm.head(hidden, ids)), np.asarray(jm(ids, mask)))
    with torch.no_grad():
        inputs = torch_inputs(BATCH)
        head = {n: p for n, p in tm.named_parameters() if is_trainable(n, "head", SPEC.num_layers)}
        by_halves = torch_llama.head_logits(tm, torch_llama.features(tm, inputs), inputs, head)
        np.testing.assert_allclose(by_halves.numpy(), tm(**inputs).logits.numpy(), rtol=0, atol=1e-6)
        np.testing.assert_allclose(torch_llama.features(tm, inputs).numpy(), np.asarray(hidden), rtol=0, atol=ATOL)
    # trainable=head: the head's parameters (final RMSNorm + score) alone, the trunk's output a constant
    head_only = nnx.All(nnx.Param, lambda path, x: is_trainable(jax_llama.hf_name(path), "head", SPEC.num_layers))
    graphdef, head, rest = nnx.split(jm, head_only, ...)

    def loss_of(head):
        logits = nnx.merge(graphdef, head, rest).head(hidden, ids)
        return optax.softmax_cross_entropy_with_integer_labels(logits, BATCH["labels"]).mean()

    assert sorted(jax_llama.to_hf(head)) == ["model.norm.weight", "score.weight"]
    by_jacfwd, by_grad = jax.jacfwd(loss_of)(head), jax.grad(loss_of)(head)
    for a, b in zip(jax.tree.leaves(by_jacfwd), jax.tree.leaves(by_grad), strict=True):
        np.testing.assert_allclose(a, b, rtol=RTOL, atol=GRAD_ATOL)


# ---------------------------------------------------------------------------------------------------------------
# LoRA


@pytest.mark.slow
@pytest.mark.parametrize(
    "lora",
    [QV, LoraSpec(rank=2, alpha=3.0, targets=("k_proj", "o_proj", "gate_proj", "up_proj", "down_proj"))],
    ids=["qv", "others"],
)
def test_lora_same_loss_and_adapter_gradients(lora):
    weights = {**WEIGHTS, **trained_adapters(SPEC, lora)}
    tm = torch_llama.build_model(SPEC, weights, lora=lora).eval()
    jm = jax_llama.build_model(SPEC, weights, lora=lora)
    for exported in (torch_llama.export_weights(tm), jax_llama.export_weights(jm)):
        assert sorted(exported) == sorted(param_shapes(SPEC, lora))
        assert all(exported[k].tobytes() == v.tobytes() for k, v in weights.items())

    trained = lambda n: is_trainable(n, "lora", SPEC.num_layers)
    for p in tm.parameters():  # PEFT leaves only its adapters requiring grad; the score trains too
        p.requires_grad_(True)
    loss_t = tm(**torch_inputs(BATCH)).loss
    loss_t.backward()
    name = torch_llama.hf_name
    grads_t = {name(n): p.grad.numpy() for n, p in tm.named_parameters() if trained(name(n))}
    loss_of, params = jax_loss_fn(jm)
    loss_j, grads_j = jax.jit(jax.value_and_grad(loss_of))(params, BATCH)
    assert abs(float(loss_j) - loss_t.item()) <= ATOL
    assert_grads_close({k: v for k, v in jax_llama.to_hf(grads_j).items() if trained(k)}, grads_t, "lora grad")
    assert len(grads_t) == len(lora_shapes(SPEC, lora)) + 1  # the adapters and the score
