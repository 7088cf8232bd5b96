"""The columns scenario=ops writes: ops.csv, one row per framework x op x shape. Times are medians, in seconds,
per call."""

COLUMNS = (
    "run_id", "started_at", "framework", "execution", "op", "shape", "rows", "cols", "dtype", "threads",
    "num_threads", "device", "device_name",
    "primal_s", "jvp_s", "vjp_s", "vjp_backward_s", "jvp_over_primal", "vjp_over_primal",
    "status", "error",
    "primal_err", "jvp_err", "vjp_err", "tolerance", "cpu_util", "warmup", "repeats", "seed",
    "sweep_id", "config_hash", "wall_time_s", "hostname", "python_version", "git_sha",
    "jax_version", "jaxlib_version", "torch_version", "experiment",
)  # fmt: skip
