"""PyTorch beyond one device, as a user runs it: `python -m bench ... parallel=ddp|fsdp devices=2` on the CPU, one
process per device over gloo. A trial of batch_size B on N devices computes exactly the single-device trial of
batch N x B, step by step, in every mode torch supports there; the replicas stay identical;
fsdp holds 1/N of the parameters and optimizer state; the collectives the program issues carry what each way of
differentiating has to exchange. And the runner's side of a process group: a rank that dies or outgrows its
memory ends the trial with the right status and no process left behind; what torch cannot run is refused before
anything starts."""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest

from tests.support import FAST, bench, bench_here, composed, rows, start_ranks

# Dropout off: each rank draws its masks over its own rows, so with dropout on only the distribution (not the
# values) matches one device's. AdamW: the optimizer state is what fsdp shards beside the parameters; its lr given,
# since case=jvp and case=mezo bring their own and the one-device reference below names the mode, not the case.
TINY = [
    *FAST,
    "framework=torch",
    "device=cpu",
    "model.dropout=0",
    "optimizer=adamw",
    "optimizer.lr=5e-5",
    "logger=none",
]
TWO = ["devices=2", "batch_size=4"]  # FAST's batch_size, per device
# Start to end through `python -m bench`, one trial per strategy: the runner starts both ranks, watches them and
# records the row. The sweeps below run the same way of measuring (bench.harness.trial) in one pair of ranks.
END_TO_END = ["case=backprop", "parallel=ddp,fsdp", *TWO]
# The other two-device trials, sweep by sweep. jvp.impl=lazy at K=2 is the other way jvp exchanges its derivatives
# (the coefficients path, tangents drawn tensor by tensor); dual and naive differ from func on one device only.
SWEEPS = {
    # remat under DDP is DDP's backprop with recomputation inside the module; under FSDP2 it meets resharding
    "ddp": ["case=inference,jvp,jacfwd_head,mezo", "parallel=ddp", *TWO],
    "fsdp": ["case=inference,backprop_remat,mezo", "parallel=fsdp", *TWO],
    # under FSDP2 the tangent is attached module by module to the parameters each unit gathered (jvp.impl=lazy)
    "jvp_lazy": ["mode=jvp", "jvp.impl=lazy", "jvp.num_tangents=2", "parallel=ddp,fsdp", *TWO],
    "fsdp_shard_grad_op": ["mode=backprop", "parallel=fsdp", "fsdp_reshard_after_forward=false", *TWO],
}


def history(results: Path, row: dict) -> dict:
    return json.loads((results / "history" / f"{row['run_id']}.json").read_text())


def label(row: dict) -> str:
    """What a trial computes: the mode, with K for jvp (remat and jvp.impl compute the same thing)."""
    return f"{row['mode']} K={row['num_tangents']}" if row["mode"] == "jvp" else row["mode"]


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory) -> dict[str, list[dict]]:
    root = tmp_path_factory.mktemp("parallel_torch")
    # every trial of SWEEPS in one pair of gloo ranks (tests/support.py: start_ranks), beside the end-to-end sweep:
    # two processes per trial would import torch 20 times instead of twice
    finish = start_ranks(2, {root / name: [*TINY, *args] for name, args in SWEEPS.items()})
    with ThreadPoolExecutor(1) as pool:  # side by side: each is mostly processes importing torch
        end_to_end = pool.submit(bench, "-m", *TINY, *END_TO_END, results=root / "end_to_end")
        try:
            end_to_end.result()
        finally:
            finish()  # recorded as the runner records a trial it spawned: rows, history, saved config
    found = {}
    for name in [*SWEEPS, "end_to_end"]:
        found[name] = rows(root / name)
        for r in found[name]:
            assert r["status"] == "ok", (name, label(r), r["error"])
            r["history"] = history(root / name, r)
    assert sorted(r["parallel"] for r in found["end_to_end"]) == ["ddp", "fsdp"]
    for r in found.pop("end_to_end"):  # each strategy's backprop, beside its sweep's other modes
        found[r["parallel"]].append(r)
    return found


def two_device_rows(sweeps) -> list[dict]:
    return [r for rs in sweeps.values() for r in rs]


def one_device_trial(row: dict) -> dict:
    """What the single-device trial of the row's global batch computes: its weights, its batches (warmup first)
    and the losses of its timed steps, by the same pieces a trial is made of, here in the test process (a trial
    process of its own per mode would double this file's time, most of it spent importing torch)."""
    from bench import data
    from bench.config import model_spec, step_spec
    from bench.torch_impl.steps import make_trainer
    from bench.weights import build_weights, weights_digest

    case = {"jacfwd": ["case=jacfwd_head"], "jvp": ["mode=jvp", f"jvp.num_tangents={row['num_tangents']}"]}
    cfg = composed(*TINY, *case.get(row["mode"], [f"mode={row['mode']}"]), "batch_size=8")
    spec = model_spec(cfg.model)
    weights = build_weights(spec, cfg.seed, cfg.model.checkpoint)
    n = cfg.warmup_steps + cfg.steps
    batches = data.make_batches(data.data_spec(cfg.data), cfg.batch_size, cfg.seq_len, cfg.seed, "train")[:n]
    trainer = make_trainer(spec, weights, step_spec(cfg), "cpu")
    losses = [float(trainer.step(trainer.to_device([b]))) for b in batches]
    return {
        "weights_digest": weights_digest(weights),
        "data_fingerprint": data.fingerprint(batches)[:16],
        "loss": losses[cfg.warmup_steps :],
    }


@pytest.mark.slow
def test_two_devices_take_the_steps_of_one_device_with_the_global_batch(sweeps):
    two = two_device_rows(sweeps)
    assert len(two) == 5 + 4 + 2 + 1
    one = {}
    for r in two:
        what = (r["parallel"], label(r), r["jvp_impl"], r["remat"], r["fsdp_reshard_after_forward"])
        one[label(r)] = ref = one.get(label(r)) or one_device_trial(r)
        assert r["world_size"] == "2" and r["global_batch_size"] == "8", what
        # the same weights, and the same examples in the same order
        assert (r["weights_digest"], r["data_fingerprint"]) == (ref["weights_digest"], ref["data_fingerprint"])
        # 1e-5: float32 sums over the batch split in two, then averaged, round apart from one sum over it whole
        assert r["history"]["loss"] == pytest.approx(ref["loss"], rel=1e-5), what
        assert len(r["history"]["loss"]) == 3


@pytest.mark.slow
def test_every_device_keeps_the_same_replicas_and_reports_its_memory(sweeps):
    for r in two_device_rows(sweeps):
        devices = r["history"]["devices"]
        assert [(d["device"], d["rank"]) for d in devices] == [(0, 0), (1, 1)], label(r)
        # the final parameters (fsdp: gathered whole) are the same bytes on both ranks after four updates
        assert len({d["params_digest"] for d in devices}) == 1, (r["parallel"], label(r))
        for d in devices:
            assert d["mem_method"] == "rss_hwm"
            assert 0 < d["baseline_mem_mb"] <= d["peak_mem_mb"] <= float(r["peak_mem_mb"])


@pytest.mark.slow
def test_fsdp_holds_half_the_parameters_and_optimizer_state_of_ddp(sweeps):
    ddp = {label(r): r for r in sweeps["ddp"] if r["remat"] == "False"}
    for f in sweeps["fsdp"] + sweeps["fsdp_shard_grad_op"]:
        d = ddp[label(f)]
        # every parameter sharded on dim 0, and every dim 0 of tiny's is even: exactly half
        assert float(f["mem_params_mb"]) == pytest.approx(float(d["mem_params_mb"]) / 2, rel=1e-6), label(f)
        if f["mode"] != "inference":
            # AdamW's two moments per parameter, plus one step count per tensor that every rank keeps whole
            assert float(d["mem_optimizer_mb"]) == pytest.approx(2 * float(d["mem_params_mb"]), rel=1e-3)
            assert 0.5 <= float(f["mem_optimizer_mb"]) / float(d["mem_optimizer_mb"]) < 0.501, label(f)


@pytest.mark.slow
def test_each_mode_exchanges_what_it_needs(sweeps):
    """The bytes the collectives carried per step (counted where the program issues them) are what
    bench.parallel.expected_comm_bytes says each way of differentiating needs:
      ddp   inference 4 (the loss); backprop 4n + 4 (DDP's buckets, then the loss); jacfwd 4n + 4 (the head's
            gradient and the loss, one buffer); jvp 4(K + 1); mezo 8 (the loss and the projection)
      fsdp  the parameters gathered for each forward pass (and again for the backward under FULL_SHARD), the
            gradient reduce-scattered (4n), and the same 4 or 8 bytes of scalars"""
    for r in two_device_rows(sweeps):
        what = (r["parallel"], label(r), r["fsdp_reshard_after_forward"])
        assert float(r["comm_bytes_per_step"]) == int(r["comm_bytes_expected"]), what
    ddp = {label(r): r for r in sweeps["ddp"]}
    n = int(ddp["backprop"]["n_trainable"])
    assert {m: float(r["comm_bytes_per_step"]) for m, r in ddp.items()} == {
        "inference": 4,
        "backprop": 4 * n + 4,
        "jvp K=1": 8,
        "mezo": 8,
        "jacfwd": 4 * int(ddp["jacfwd"]["n_trainable"]) + 4,
    }
    lazy = {r["parallel"]: float(r["comm_bytes_per_step"]) for r in sweeps["jvp_lazy"]}
    assert lazy["ddp"] == 4 * (2 + 1)
    fsdp = {
        (label(r), r["fsdp_reshard_after_forward"]): float(r["comm_bytes_per_step"])
        for r in sweeps["fsdp"] + sweeps["fsdp_shard_grad_op"]
    }
    gather = 4 * n  # tiny's dim 0s are even: FSDP2 pads nothing on two devices
    assert fsdp == {
        ("inference", "True"): gather + 4,
        ("mezo", "True"): 2 * gather + 8,
        ("backprop", "True"): 2 * gather + 4 * n + 4,  # remat recomputes on the parameters gathered for backward
        ("backprop", "False"): gather + 4 * n + 4,  # SHARD_GRAD_OP keeps them from the forward pass
    }
    # jvp: a gather per tangent's forward pass, then [loss, d_1..d_K] in one all-reduce
    assert lazy["fsdp"] == 2 * gather + 12


# ---------------------------------------------------------------------------------------------------------------
# failures: the runner's side of a process group


def trial_processes(marker: str) -> list[psutil.Process]:
    """Processes still running whose environment carries `marker`: the runner passes its own environment on
    to every trial process, and other sweeps on this host are not ours to count."""
    found = []
    for p in psutil.process_iter():
        try:
            if p.environ().get("BENCH_TEST_MARKER") == marker:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


@pytest.mark.slow
def test_a_rank_that_dies_ends_the_trial_as_crashed_and_leaves_no_process(tmp_path):
    marker = str(tmp_path)
    env = {"BENCH_INJECT_FAULT": "after_warmup_rank1:segv", "BENCH_TEST_MARKER": marker}
    proc = bench(*TINY, "mode=backprop", "parallel=ddp", *TWO, "timeout_s=120", results=tmp_path, env=env, check=False)
    assert proc.returncode == 1  # a crashed trial fails the command
    (row,) = rows(tmp_path)
    assert row["status"] == "crashed"
    assert row["error"].startswith("rank 1: trial process died (killed by SIGSEGV)"), row["error"]
    # rank 0, waiting in a collective for rank 1, was stopped at once rather than at timeout_s
    assert float(row["wall_time_s"]) < 60
    assert not trial_processes(marker)


@pytest.mark.slow
def test_a_rank_over_its_host_memory_limit_is_oom(tmp_path):
    marker = str(tmp_path)
    # 150 MiB: below what a Python process with torch imported holds (~400 MiB here), so a rank outgrows it
    bench(
        *TINY,
        "mode=backprop",
        "parallel=ddp",
        *TWO,
        "max_host_mem_mb=150",
        results=tmp_path,
        env={"BENCH_TEST_MARKER": marker},
    )
    (row,) = rows(tmp_path)
    assert row["status"] == "oom"
    assert re.match(r"rank [01]: host memory limit max_host_mem_mb=150\.0 exceeded", row["error"]), row["error"]
    assert not trial_processes(marker)


@pytest.mark.parametrize(
    "args,expected",
    [
        (["mode=jvp"], "jvp.impl=auto with parallel=fsdp: forward-mode AD through FSDP2's sharded parameters fails"),
        (["mode=jacfwd", "trainable=head"], "mode=jacfwd with parallel=fsdp, framework=torch: forward-mode AD"),
        (["fsdp_offload=true"], "fsdp_offload=true: the parameters already live in host memory on a CPU device"),
    ],
)
def test_what_torch_cannot_run_is_one_line_and_nothing_runs(tmp_path, args, expected):
    proc = bench_here("framework=torch", "device=cpu", "parallel=fsdp", "devices=2", *args, results=tmp_path)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bench: error: ") and expected in lines[0], proc.stderr
    assert not (tmp_path / "runs.csv").exists() and not (tmp_path / "hydra").exists()


def test_a_process_group_of_another_size_is_refused(monkeypatch):
    from bench.torch_impl.parallel import start

    monkeypatch.setenv("WORLD_SIZE", "3")
    cfg = composed("framework=torch", "parallel=ddp", "devices=2", "nodes=1", "device=cpu")
    with pytest.raises(
        ValueError,
        match=r"parallel=ddp: 3 process\(es\) started \(WORLD_SIZE\), devices=2 x "
        r"nodes=1 = 2 expected",
    ):
        start(cfg)
