"""The plain loop's process: `python -m bench.scenarios.overhead.plain FRAMEWORK MODEL B T STEPS WARMUP LR SEED`
prints the step times (one JSON line) of the framework's plain training loop (bench/<framework>_impl/plain.py)
around the suite's own model, weights and batches, in a fresh process with the user's own environment."""

from __future__ import annotations

import json
import os
import signal
import sys

from bench import data
from bench.config import model_spec, resolve
from bench.harness.launch import adopt
from bench.harness.preflight import compose_trials
from bench.spec import implementation
from bench.weights import build_weights


def batches(model: str, batch_size: int, seq_len: int, n: int, seed: int):
    """The suite's training batches for this model and shape (numpy), as a trial makes them, and its config."""
    ((_, composed),) = compose_trials(
        [f"model={model}", f"batch_size={batch_size}", f"seq_len={seq_len}", f"seed={seed}"], multirun=False
    )[0]
    cfg = resolve(composed)
    out = data.make_batches(data.data_spec(cfg.data), batch_size, seq_len, seed, "train", epochs=1)
    while len(out) < n:
        out = out + out
    return out[:n], cfg


def main(
    framework: str, model: str, batch_size: int, seq_len: int, steps: int, warmup: int, lr: float, seed: int
) -> list[float]:
    micro, cfg = batches(model, batch_size, seq_len, warmup + steps, seed)
    spec = model_spec(cfg.model)
    return implementation(framework, "plain").plain_loop(spec, build_weights(spec, seed, None), micro, lr, warmup, seed)


if __name__ == "__main__":
    adopt(signal.SIGKILL)  # dies with bench overhead, however it ends
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    fw, model, *numbers = sys.argv[1:]
    b, t, steps, warmup = map(int, numbers[:4])
    print(json.dumps(main(fw, model, b, t, steps, warmup, float(numbers[4]), int(numbers[5]))))
