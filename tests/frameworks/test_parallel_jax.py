"""JAX beyond one device, as a user runs it: `python -m bench ... parallel=ddp|fsdp devices=2` on two CPU devices
(one process owning both), and two processes joined by jax.distributed. A trial of batch_size B on N devices
computes exactly the single-device trial of batch N x B, step by step, in every mode; fsdp holds 1/N of the
parameters and optimizer state; the bytes counted in the compiled programs are what each way of differentiating
has to exchange."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bench.config import model_preset
from bench.models.bert import param_shapes
from tests.support import FAST, REPO, composed, rows, run_here, start_ranks

# Dropout off, as the torch tests need it (each rank draws its own masks). JAX would match with dropout on too
# (threefry keys are partitionable: an element's mask bit depends on its index in the global batch, not on which
# device holds it). AdamW: the optimizer state is what fsdp shards beside the parameters.
TINY = [*FAST, "framework=jax", "device=cpu", "model.dropout=0", "optimizer=adamw", "logger=none"]
CASES = "inference,backprop,backprop_remat,jvp,jacfwd_head,mezo"
SPEC, _ = model_preset("tiny")
SEQ_LEN = 32  # FAST's seq_len
# fsdp shards every tensor of two axes or more (each of tiny's has an even axis), the vectors stay whole
SHARDED = sum(int(np.prod(s)) for s in param_shapes(SPEC).values() if len(s) >= 2)


def history(results: Path, row: dict) -> dict:
    return json.loads((results / "history" / f"{row['run_id']}.json").read_text())


def label(row: dict) -> str:
    return f"{row['mode']}{' remat' if row['remat'] == 'True' else ''}"


# Start to end through `python -m bench`, one trial per strategy: the runner starts the trial's process with two
# CPU devices and records the row. The other cases run the same way of measuring (bench.harness.trial) in one
# process owning two devices (start_ranks): a process per trial would start JAX ten times more.
END_TO_END = "backprop"
SWEEPS = ",".join(c for c in CASES.split(",") if c != END_TO_END)


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory) -> dict[str, list[dict]]:
    """Every mode three ways: on two devices (ddp, fsdp: batch_size 4 each), in processes of their own (JAX fixes
    its device count when it starts), side by side; meanwhile on one (batch_size 8) in this process: what is
    compared with it is its losses, not its process."""
    root = tmp_path_factory.mktemp("parallel_jax")
    two = {p: [f"case={SWEEPS}", *TINY, f"parallel={p}", "devices=2"] for p in ("ddp", "fsdp")}
    finish = start_ranks(1, {root / p: args for p, args in two.items()})
    cli = [sys.executable, "-m", "bench", "-m", f"case={END_TO_END}", *TINY, "parallel=ddp,fsdp", "devices=2"]
    end_to_end = subprocess.Popen(
        [*cli, f"results_dir={root / 'end_to_end'}"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        run_here("-m", f"case={CASES}", *TINY, "batch_size=8", results=root / "none")
        log = end_to_end.communicate(timeout=900)[0]
    finally:
        end_to_end.kill()  # a no-op once it ended
        finish()  # recorded as the runner records a trial it spawned: rows, history, saved config
    assert end_to_end.returncode == 0, log
    found = {"two": [], "one": []}
    for folder in ("ddp", "fsdp", "end_to_end", "none"):
        for r in rows(root / folder):
            assert r["status"] == "ok", (label(r), r["parallel"], r["error"])
            r["history"] = history(root / folder, r)
            found["one" if folder == "none" else "two"].append(r)
    assert len(found["two"]) == 12 and len(found["one"]) == 6
    return found


def by_mode(rs: list[dict], parallel: str) -> dict[str, dict]:
    return {label(r): r for r in rs if r["parallel"] == parallel}


@pytest.mark.slow
def test_two_devices_take_the_steps_of_one_device_with_the_global_batch(sweeps):
    one = by_mode(sweeps["one"], "none")
    for parallel in ("ddp", "fsdp"):
        two = by_mode(sweeps["two"], parallel)
        assert two.keys() == one.keys()
        for mode, r in two.items():
            assert r["world_size"] == "2" and r["global_batch_size"] == "8" and r["weights_digest"]
            assert r["data_fingerprint"] == one[mode]["data_fingerprint"]  # the same examples in the same order
            # 1e-5: float32 sums over the batch split in two, then added, round apart from one sum over it whole
            assert r["history"]["loss"] == pytest.approx(one[mode]["history"]["loss"], rel=1e-5), (parallel, mode)


@pytest.mark.slow
def test_every_device_keeps_the_same_replicas_and_reports_its_memory(sweeps):
    for r in sweeps["two"]:
        devices = r["history"]["devices"]
        assert [d["device"] for d in devices] == [0, 1], label(r)
        # ddp: every parameter; fsdp: the replicated vectors. The same bytes on both devices after three updates.
        assert len({d["params_digest"] for d in devices}) == 1, (label(r), r["parallel"])
        for d in devices:
            assert d["mem_method"] == "xla_memory_analysis"
            assert 0 < d["baseline_mem_mb"] < d["peak_mem_mb"] <= float(r["peak_mem_mb"])
        assert float(r["host_peak_rss_mb"]) > float(r["peak_mem_mb"])  # the process holds both devices and more


@pytest.mark.slow
def test_fsdp_holds_half_the_parameters_and_optimizer_state_of_ddp(sweeps):
    ddp, fsdp = by_mode(sweeps["two"], "ddp"), by_mode(sweeps["two"], "fsdp")
    for mode, f in fsdp.items():
        d = ddp[mode]
        # half of the matrices, all of the vectors (LayerNorm scales and biases: 0.08% of tiny's parameters)
        assert 0.5 < float(f["mem_params_mb"]) / float(d["mem_params_mb"]) < 0.51, mode
        if mode in ("backprop", "backprop remat", "jvp", "mezo"):  # AdamW over every parameter: mu and nu
            assert float(d["mem_optimizer_mb"]) == pytest.approx(2 * float(d["mem_params_mb"]), rel=1e-3)
            assert 0.5 < float(f["mem_optimizer_mb"]) / float(d["mem_optimizer_mb"]) < 0.51, mode
        assert float(f["baseline_mem_mb"]) < 0.51 * float(d["baseline_mem_mb"]), mode


def xla_exchanges(mode: str, parallel: str, n: int, k: int) -> int:
    """What XLA's compiled step exchanges per device per step, in bytes (fp32), on tiny (n trainable parameters,
    K tangents), where it differs from bench.parallel.expected_comm_bytes's definition:
      backprop  the position-embedding gradient's rows past seq_len are a constant zero: XLA all-reduces the
                first seq_len rows only, 4 (P - T) H bytes fewer than 4n (torch all-reduces them all)
      fsdp      each program gathers the parameters once: the backward pass uses the gathered parameters the
                forward kept (no second gather), jvp gathers once for all K tangents and never gathers a
                tangent (each device draws it whole, the same values as one device, without exchanging any)"""
    s, loss = 4, 4
    gather = s * SHARDED if parallel == "fsdp" else 0
    gradient = s * (n - (SPEC.max_position_embeddings - SEQ_LEN) * SPEC.hidden_size)
    backprop = gather + gradient + loss
    return {
        "inference": gather + loss,
        "backprop": backprop,
        "backprop remat": backprop,
        "jvp": gather + s * (k + 1),
        "jacfwd": gather + s * n + loss,
        "mezo": 2 * gather + 2 * s,
    }[mode]


@pytest.mark.slow
def test_the_compiled_steps_exchange_what_each_mode_needs(sweeps):
    """comm_bytes_per_step is read from the compiled programs' HLO: every collective, by its buffer's bytes."""
    for r in sweeps["two"]:
        counted, expected = float(r["comm_bytes_per_step"]), int(r["comm_bytes_expected"])
        what = (label(r), r["parallel"])
        xla = xla_exchanges(label(r), r["parallel"], int(r["n_trainable"]), int(r["num_tangents"]))
        if what == ("jacfwd", "fsdp"):
            # XLA also reshuffles the flattened head among the devices, a few KB (torch refuses jacfwd with fsdp)
            assert 0 < counted - xla < 64 * 1024, counted
        else:
            assert counted == xla, (what, counted)
        if what in {
            ("inference", "ddp"),
            ("jvp", "ddp"),
            ("jacfwd", "ddp"),
            ("mezo", "ddp"),
            ("inference", "fsdp"),
            ("mezo", "fsdp"),
        }:
            assert counted == expected, (what, counted)  # the definition, to the byte
    ddp = by_mode(sweeps["two"], "ddp")
    assert {m: int(float(ddp[m]["comm_bytes_per_step"])) for m in ("inference", "jvp", "mezo")} == {
        "inference": 4,  # the loss
        "jvp": 8,  # the loss and the one directional derivative (K=1)
        "mezo": 8,  # L+ and L-
    }


# What the seeded directions cost under fsdp, read from the compiled programs (in a fresh process: the CPU device
# count is fixed when JAX starts).
DIRECTIONS = """
import json, sys
from bench.config import model_spec, resolve, step_spec
from bench.harness.preflight import compose_trials
from bench.jax_impl import parallel, steps
from bench.weights import build_weights

trials, _ = compose_trials(sys.argv[1:], multirun=False)
cfg = resolve(trials[0][1])
world = parallel.start(cfg)
spec = model_spec(cfg.model)
trainer = steps.make_trainer(spec, build_weights(spec, 0, None), step_spec(cfg), world.device, world=world)
batch = {"input_ids": [[101] * 8] * 4, "token_type_ids": [[0] * 8] * 4, "attention_mask": [[1] * 8] * 4,
         "labels": [0] * 4}
trainer.compile(trainer.to_device([batch] * cfg.grad_accum))
names = ("move_loss", "move", "update")  # MeZO's programs, in the order Trainer.programs() lists them
print(json.dumps({name: {"comm": parallel.program_comm_bytes(p.as_text(), 2),
                         "temp": p.memory_analysis().temp_size_in_bytes}
                  for name, (p, _) in zip(names, trainer.programs(), strict=True)}))
"""


@pytest.mark.slow
def test_fsdp_draws_each_devices_part_of_the_directions_without_exchanging_them():
    """MeZO under fsdp: the perturbation and the update regenerate z from its key on each device, for its own
    shard: no collective, and no whole z (XLA's SPMD partitioner replicates the random-bit generator and slices
    each device's part, and XLA:CPU fuses the slice into the generator, so the rest is never computed). Two
    micro-batches, so that a move runs alone (between them) beside the moves fused with a loss."""
    args = [*TINY, "mode=mezo", "parallel=fsdp", "devices=2", "seq_len=8", "optimizer=sgd", "grad_accum=2"]
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_cpu_enable_concurrency_optimized_scheduler=false"}
    out = subprocess.run(
        [sys.executable, "-c", DIRECTIONS, *args], cwd=REPO, capture_output=True, text=True, env=env, timeout=600
    )
    assert out.returncode == 0, out.stderr
    programs = json.loads(out.stdout.strip().splitlines()[-1])
    word_embeddings_shard = SPEC.vocab_size * SPEC.hidden_size * 4 // 2  # the largest tensor's part on one device
    for name in ("move", "update"):
        assert programs[name]["comm"] == 0, programs
        # never a whole (or half) z; the small tensors' shared draw (positions, pooler, ...: 70 KB) is whole on
        # every device (directions._units), ~3x that in temporaries
        assert programs[name]["temp"] < word_embeddings_shard / 4, programs
    assert programs["move_loss"]["comm"] == 4 * SHARDED + 4  # the loss's alone: the matrices gathered, it reduced


@pytest.mark.slow
def test_two_processes_run_one_trial_through_jax_distributed(tmp_path, sweeps):
    """As a two-task submitit job starts a JAX trial: two trial processes (`python -m bench.scenarios PAYLOAD
    RESULT`), one CPU device each, RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT in their environment; rank 0
    reports the whole trial."""
    from bench.config import to_dict
    from bench.harness.launch import TRIAL_MODULE, free_port
    from bench.harness.runner import trial_env
    from bench.scenarios import SCENARIOS

    cfg = composed(*TINY, "mode=backprop", "parallel=fsdp", "devices=2")
    (tmp_path / "payload.json").write_text(json.dumps(to_dict(cfg)))
    port = free_port()
    procs = []
    for rank in range(2):
        env = {
            **os.environ,
            **trial_env(cfg, SCENARIOS["model"]),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "RANK": str(rank),
            "WORLD_SIZE": "2",
            "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": "2",
        }
        cmd = [sys.executable, "-m", TRIAL_MODULE, str(tmp_path / "payload.json"), str(tmp_path / f"{rank}.json")]
        procs.append(subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    logs = [p.communicate(timeout=600)[0].decode(errors="replace") for p in procs]
    assert [p.returncode for p in procs] == [0, 0], logs
    main, other = (json.loads((tmp_path / f"{rank}.json").read_text()) for rank in range(2))
    assert other == {"status": "ok", "rank": 1}
    devices = main["history"]["devices"]
    assert [(d["device"], d["rank"]) for d in devices] == [(0, 0), (1, 1)]
    assert len({d["params_digest"] for d in devices}) == 1
    one_process = by_mode(sweeps["two"], "fsdp")["backprop"]  # the same trial, one process owning both devices
    assert main["world_size"] == 2 and main["comm_bytes_per_step"] == float(one_process["comm_bytes_per_step"])
    reference = by_mode(sweeps["one"], "none")["backprop"]["history"]["loss"]
    assert main["history"]["loss"] == pytest.approx(reference, rel=1e-5)
