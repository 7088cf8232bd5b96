"""The columns `python -m bench capacity` writes: capacity.csv, one row per search (the probes themselves are
model trials, rows of runs.csv)."""

RESULTS_FILE = "capacity.csv"
COLUMNS = (
    "capacity_id",
    "started_at",
    "framework",
    "mode",
    "model",
    "num_layers",
    "search",
    "batch_size",
    "seq_len",
    "budget_mb",
    "device",
    "device_name",
    "parallel",
    "devices",
    "dtype",
    "optimizer",
    "trainable",
    "remat",
    "jvp_impl",
    "verdict",
    "max_value",
    "peak_mem_mb",
    "step_time_median_s",
    "tokens_per_s",
    "probes",
    "probe_values",
    "probe_run_ids",
    "experiment",
    "lora_rank",
    "lora_alpha",
    "lora_dropout",
    "lora_targets",  # trainable=lora's adapters
    "ladder",  # --ladder's factor: every rung measured up to what fits (empty: the bisecting search)
)
# What makes two searches the same search (the latest of each is shown): every column but the outcome and its ids.
OUTCOME_COLUMNS = (
    "capacity_id",
    "started_at",
    "verdict",
    "max_value",
    "peak_mem_mb",
    "step_time_median_s",
    "tokens_per_s",
    "probes",
    "probe_values",
    "probe_run_ids",
    "device_name",
    "experiment",
)
