"""Hydra instantiates sweepers only from its `hydra_plugins` namespace: this names bench's tuning sweeper there.
What it does is bench/harness/tuning.py's; `hydra/sweeper=bench_tuning` (bench/config.py) selects it."""

from bench.harness import tuning


class TuningSweeper(tuning.TuningSweeper):
    pass
