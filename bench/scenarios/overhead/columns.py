"""The columns `python -m bench overhead` writes: overhead.csv, one row per framework and shape measured."""

COLUMNS = (
    "framework",
    "model",
    "batch_size",
    "seq_len",
    "optimizer",
    "lr",
    "steps",
    "warmup_steps",
    "rounds",
    "suite_step_s",
    "plain_step_s",
    "ratio",
    "suite_steps_s",
    "plain_steps_s",
    "device",
    "device_name",
    "timestamp",
)
