"""What the harness costs: the suite's backprop trial against a plain training loop, per framework, interleaved.

    python -m bench.overhead                          # MiniLM-L6, B8 T128, SGD, both frameworks, 3 rounds
    python -m bench.overhead --framework jax --rounds 5 --steps 10 --model tiny
    -> a table on stdout, one row per framework appended to results/overhead.csv (read by bench.targets)

The plain loop is what a user would write without the suite, in a fresh process with the user's own environment,
around the very model the suite trains (its builders, weights and batches, on the device the suite's
device=auto takes): torch trains HF's BertForSequenceClassification (eager attention, as the suite's torch
trials use, because forward-mode AD has no rule for fused attention) with `model(**batch).loss.backward()` and
torch.optim.SGD; JAX trains the NNX model with one jax.jit'd value_and_grad + optax.sgd step, parameters and
optimizer state donated. Both warm up as many steps, time each step the same way (perf_counter around the step,
until the device is done) and report the median. The suite's side is a whole trial through `python -m bench`
(runner, spawned child, memory trackers, parent's watchdog), its per-step times read back from its history.

Rounds alternate which side goes first, so a drift of the host (turbo, another job) falls on both; the ratio is
the median of the suite's medians over the median of the plain loop's. Target: <= 1.02 (bench.targets.OVERHEAD_LIMIT).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import data
from bench.config import available, bert_spec, to_container
from bench.errors import ConfigError
from bench.preflight import compose_trials
from bench.results import read_history
from bench.sinks import CsvSink, ResultsFileError, check_results_file, read_rows
from bench.spec import implementation
from bench.tables import OneLineParser, fixed_width
from bench.targets import OVERHEAD_LIMIT
from bench.weights import build_weights

FRAMEWORKS = ("torch", "jax")
COLUMNS = ("framework", "model", "batch_size", "seq_len", "optimizer", "lr", "steps", "warmup_steps", "rounds",
           "suite_step_s", "plain_step_s", "ratio", "suite_steps_s", "plain_steps_s", "device", "device_name",
           "timestamp")  # fmt: skip


# ---------------------------------------------------------------------------------------------------------------
# the plain loops (run in their own process: python -m bench.overhead --plain FRAMEWORK ...)


def batches(model: str, batch_size: int, seq_len: int, n: int, seed: int):
    """The suite's training batches for this model and shape (numpy), as a trial makes them."""
    (_, cfg), = compose_trials([f"model={model}", f"batch_size={batch_size}", f"seq_len={seq_len}", f"seed={seed}"],
                               multirun=False)[0]  # fmt: skip
    c = to_container(cfg)
    out = data.make_batches(data.data_spec(c["data"]), batch_size, seq_len, seed, "train", epochs=1)
    while len(out) < n:
        out = out + out
    return out[:n], c


def plain_torch(model: str, batch_size: int, seq_len: int, steps: int, warmup: int, lr: float, seed: int):
    import torch

    micro, c = batches(model, batch_size, seq_len, warmup + steps, seed)
    spec, device = bert_spec(c["model"]), implementation("torch", "device").resolve_device("auto")  # as the suite's
    # the suite's HF BertForSequenceClassification with its weights: both sides train the very same model
    net = implementation("torch", "steps").build_model(spec, build_weights(spec, seed, None), device, "eager")
    net.train()
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    inputs = [{k: torch.from_numpy(v).long().to(device) for k, v in b.items()} for b in micro]
    times = []
    for i, b in enumerate(inputs):
        t0 = time.perf_counter()
        net(**b).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return times


def plain_jax(model: str, batch_size: int, seq_len: int, steps: int, warmup: int, lr: float, seed: int):
    import jax
    import optax
    from flax import nnx

    micro, c = batches(model, batch_size, seq_len, warmup + steps, seed)
    spec, dev = bert_spec(c["model"]), implementation("jax", "device")
    dev.use_fp32()  # true fp32 matmuls on a GPU, as the suite's (XLA would take TF32)
    device = dev.resolve_device("auto")
    # the suite's NNX BERT with its weights: both sides train the very same model
    graphdef, params = nnx.split(implementation("jax", "steps").build_model(spec, build_weights(spec, seed, None)))
    params = jax.device_put(params, device)
    tx = optax.sgd(lr)
    opt_state = tx.init(params)

    def loss_of(params, batch, key):
        logits = nnx.merge(graphdef, params)(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"],
                                             deterministic=False, rngs=nnx.Rngs(dropout=key))  # fmt: skip
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch["labels"]).mean()

    def train_step(params, opt_state, batch, key):
        loss, grads = jax.value_and_grad(loss_of)(params, batch, key)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    train_step = jax.jit(train_step, donate_argnums=(0, 1))
    inputs = [jax.device_put({k: v.astype("int32") for k, v in b.items()}, device) for b in micro]
    key, times = jax.random.key(seed), []
    for i, b in enumerate(inputs):
        t0 = time.perf_counter()
        params, opt_state, loss = train_step(params, opt_state, b, jax.random.fold_in(key, i))
        jax.block_until_ready(params)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return times


PLAIN = {"torch": plain_torch, "jax": plain_jax}


# ---------------------------------------------------------------------------------------------------------------
# the two sides, each in a fresh process


def run_plain(framework: str, a) -> list[float]:
    cmd = [sys.executable, "-m", "bench.overhead", "--plain", framework, "--model", a.model,
           "--batch-size", str(a.batch_size), "--seq-len", str(a.seq_len), "--steps", str(a.steps),
           "--warmup", str(a.warmup), "--lr", str(a.lr), "--seed", str(a.seed)]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"plain {framework} loop failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_suite(framework: str, a, scratch: Path) -> tuple[list[float], dict]:
    """One backprop trial through the suite's own command line: its per-step times (the trial's history) and its
    row. Plain SGD, as the plain loop's."""
    results = scratch / f"{framework}_{time.monotonic_ns()}"
    cmd = [sys.executable, "-m", "bench", f"framework={framework}", "case=backprop", f"model={a.model}",
           f"batch_size={a.batch_size}", f"seq_len={a.seq_len}", f"steps={a.steps}", f"warmup_steps={a.warmup}",
           "optimizer=sgd", f"optimizer.lr={a.lr}", "optimizer.momentum=0", "optimizer.weight_decay=0",
           f"seed={a.seed}", f"results_dir={results}", "logger.mode=disabled"]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True)
    rows = read_rows(results / "runs.csv")
    history = read_history({**rows[-1], "_source": str(results / "runs.csv")}) if rows else None
    if out.returncode != 0 or not history or rows[-1]["status"] != "ok":
        raise RuntimeError(f"suite {framework} trial failed:\n{out.stdout[-1000:]}{out.stderr[-1000:]}")
    return history["step_time_s"], rows[-1]


def measure(framework: str, a, scratch: Path) -> dict:
    suite, plain, row = [], [], {}
    for r in range(a.rounds):
        sides = [("suite", suite), ("plain", plain)]
        for name, acc in sides if r % 2 == 0 else sides[::-1]:
            if name == "suite":
                times, row = run_suite(framework, a, scratch)
            else:
                times = run_plain(framework, a)
            acc.append(statistics.median(times))
            print(f"  {framework} round {r + 1}/{a.rounds} {name:5s} step {acc[-1] * 1e3:7.1f} ms", flush=True)
    s, p = statistics.median(suite), statistics.median(plain)
    return {"framework": framework, "model": a.model, "batch_size": a.batch_size, "seq_len": a.seq_len,
            "optimizer": "sgd", "lr": a.lr, "steps": a.steps, "warmup_steps": a.warmup, "rounds": a.rounds,
            "suite_step_s": s, "plain_step_s": p, "ratio": s / p,
            "suite_steps_s": " ".join(f"{x:.4f}" for x in suite), "plain_steps_s": " ".join(f"{x:.4f}" for x in plain),
            "device": row["device"], "device_name": row["device_name"],
            "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S")}  # fmt: skip


def table(rows: list[dict]) -> str:
    head = ["framework", "model", "shape", "suite step", "plain step", "ratio", "target"]
    ms = lambda x: f"{float(x) * 1e3:.1f} ms"  # noqa: E731
    cells = [[r["framework"], r["model"], f"B{r['batch_size']} T{r['seq_len']}", ms(r["suite_step_s"]),
              ms(r["plain_step_s"]), f"{float(r['ratio']):.3f}x",
              "met" if float(r["ratio"]) <= OVERHEAD_LIMIT else "MISSED"] for r in rows]  # fmt: skip
    return fixed_width(head, cells)


def parser() -> OneLineParser:
    p = OneLineParser("bench.overhead", "python -m bench.overhead [options]", description=__doc__.splitlines()[0])
    p.add_argument("--framework", default="torch,jax", help="torch, jax or torch,jax (default both)")
    p.add_argument("--model", default="minilm_l6", help="a conf/model preset (default minilm_l6)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--steps", type=int, default=10, help="timed steps per run (default 10)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first (default 2; the first compiles)")
    p.add_argument("--rounds", type=int, default=3, help="suite/plain pairs per framework (default 3)")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="results/overhead.csv", help="CSV the rows are appended to")
    p.add_argument("--plain", choices=FRAMEWORKS, help=argparse.SUPPRESS)  # the child's side
    return p


def validate(a) -> list[str]:
    """The frameworks to measure; ConfigError (one line) for a bad option, ResultsFileError for an --out that
    cannot take the rows, before any process starts."""
    frameworks = [f for f in a.framework.split(",") if f]
    if not frameworks or any(f not in FRAMEWORKS for f in frameworks):
        raise ConfigError(f"--framework={a.framework}: accepted torch, jax or torch,jax")
    for name in ("batch_size", "seq_len", "steps", "warmup", "rounds"):
        if getattr(a, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')}={getattr(a, name)}: accepted an integer >= 1")
    if a.model not in available("model"):
        raise ConfigError(f"--model={a.model}: accepted {', '.join(available('model'))}")
    check_results_file(Path(a.out), COLUMNS)
    return frameworks


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    if a.plain:  # the child: one plain loop, its step times as one JSON line
        print(json.dumps(PLAIN[a.plain](a.model, a.batch_size, a.seq_len, a.steps, a.warmup, a.lr, a.seed)))
        return 0
    try:
        frameworks = validate(a)
    except (ConfigError, ResultsFileError) as e:
        print(f"bench.overhead: error: {e}", file=sys.stderr)
        return 2
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_overhead_") as scratch:
        for fw in frameworks:
            rows.append(measure(fw, a, Path(scratch)))
            CsvSink(a.out, COLUMNS).write(rows[-1])
    print(table(rows))
    print(f"(suite / plain loop, medians of {a.rounds} interleaved runs of {a.steps} steps; appended to {a.out})")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
