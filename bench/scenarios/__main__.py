"""A trial process: `python -m bench.scenarios PAYLOAD RESULT`, spawned by the runner (bench/harness/runner.py),
which runs the payload's scenario (bench/harness/trial.py)."""

import sys

from bench.harness import trial
from bench.scenarios import SCENARIOS

if __name__ == "__main__":
    trial.main(SCENARIOS, sys.argv[1], sys.argv[2])
