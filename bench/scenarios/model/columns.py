"""The columns scenario=model writes: runs.csv, one row per trial. Columns are only ever added, at the end
(CsvSink widens an older file's header); a CSV written before a column existed reads it as empty."""

from bench import estimators

# runs.csv's schema. Required columns first, in this order; a trial fills what it knows, the rest are empty.
REQUIRED_COLUMNS = (
    "run_id",
    "started_at",
    "framework",
    "mode",
    "model",
    "data",
    "trainable",
    "optimizer",
    "batch_size",
    "seq_len",
    "steps",
    "seed",
    "remat",
    "num_tangents",
    "device",
    "device_name",
    "dtype",
    "n_params",
    "n_trainable",
    "status",
    "error",
    "compile_time_s",
    "step_time_median_s",
    "step_time_p10_s",
    "step_time_p90_s",
    "samples_per_s",
    "peak_mem_mb",
    "excess_mem_mb",
    "mem_method",
    "loss_first",
    "loss_last",
    "jax_version",
    "torch_version",
    "git_sha",
)
EXTRA_COLUMNS = (
    "sweep_id",
    "config_hash",
    "jvp_impl",
    "warmup_steps",
    "warmup_time_s",
    "step_time_mean_s",
    "step_time_stdev_s",
    "tokens_per_s",
    "baseline_mem_mb",
    "gpu_peak_reserved_mb",
    "nvml_peak_mb",
    "host_peak_rss_mb",
    "weights_digest",
    "num_layers",
    "hidden_size",
    "grad_cosine",
    "eval_accuracy",
    "wall_time_s",
    "hostname",
    "python_version",
    "grad_accum",
    "last_k",
    "jacfwd_chunk",
    "data_fingerprint",
    "jaxlib_version",
    "flax_version",
    "transformers_version",
    "epochs",
    "total_train_time_s",
    "eval_loss",
    "steps_timed",
    "max_timed_s",
    # knobs that change the measured numbers (the report never merges rows that differ in one)
    "attn_implementation",
    "mezo_eps",
    "dropout",
    "lr",
    "momentum",
    "weight_decay",
    "beta1",
    "beta2",
    "adam_eps",
    # beyond one device (bench/parallel.py): memory columns above are the largest over devices
    "parallel",
    "devices",
    "nodes",
    "world_size",
    "global_batch_size",
    "fsdp_reshard_after_forward",
    "fsdp_offload",
    "comm_bytes_per_step",
    "comm_bytes_expected",
    "mem_params_mb",
    "mem_optimizer_mb",
    "experiment",  # the conf/experiment a trial was launched by (+experiment=NAME), empty otherwise
    "budget_mb",  # the memory budget the trial ran under (the capacity search's probes)
    "n_sharded",  # parameters the parallel strategy shards over the devices (fsdp)
    # what holds the memory (bench/<framework>_impl/memory.py), per device like the memory columns above, and
    # what the memory model predicts (bench/measure/memory_model.py): docs/memory.md
    "mem_trainable_mb",
    "mem_grads_mb",
    "mem_directions_mb",
    "mem_saved_mb",
    "mem_temp_mb",
    "mem_tracked_peak_mb",
    "mem_breakdown_method",
    "mem_predicted_mb",
    "mem_predicted_saved_mb",
    "mem_predicted_grads_mb",
    "mem_predicted_directions_mb",
    "mem_predicted_temp_mb",
    "directions",  # jvp's tangents and MeZO's perturbations: gaussian | rademacher
    "jvp_tangent",  # jvp, one tangent: auto | keep (drawn once) | redraw (drawn again for the update)
    # reproducibility (docs/reproducibility.md): the kernels' mode and the intra-op threads a step ran on
    "deterministic",
    "num_threads",
    "compile",  # torch.compile (torch only; docs/speed.md)
    "diverged_at",  # status diverged: the step whose loss turned non-finite or past divergence_factor x the first
    # cost to a target (docs/cost-to-target.md): the target, whether and when it was reached, what it cost
    "target_metric",
    "target_value",
    "target_max_steps",
    "target_status",
    "steps_to_target",
    "samples_to_target",
    "seconds_to_target",
    "wall_to_target_s",
    "mib_s_to_target",
    "tuning",
    "tune_group",
    "tune_study",
    # where a step's time goes (docs/time.md): profile=true's trace, its steps' time by category
    # (bench/measure/timeline.py), and the FLOPs of a step, counted by the framework and predicted
    # (bench/measure/flop_model.py), achieved against this host's measured matmul peak and a GPU's published one
    "profile",
    "profile_steps",
    "trace_status",
    "trace_path",
    "profile_steps_traced",
    "profile_step_ms",
    "time_matmul_ms",
    "time_attention_ms",
    "time_elementwise_ms",
    "time_random_ms",
    "time_optimizer_ms",
    "time_collectives_ms",
    "time_overhead_ms",
    "flops_per_step",
    "flops_method",
    "flops_predicted",
    "flops_per_s",
    "matmul_peak_flops_per_s",
    "utilisation",
    "peak_flops_per_s",
    "mfu",
    "lora_rank",
    "lora_alpha",
    "lora_dropout",
    "lora_targets",  # trainable=lora's adapters (docs/lora.md)
    "scan_layers",  # JAX: the encoder as a lax.scan over stacked layers, or unrolled (docs/speed.md)
    "aot_compile_s",  # JAX: the ahead-of-time compile alone, before the first step (torch: nothing to compile)
    "model_note",  # which models (memory, FLOP, communication) have no term for the mode: their cells are empty
    # cost to a target, what its numbers depend on beyond the above (docs/cost-to-target.md): the evaluation
    # interval and resolution (steps to the target are known to within them), the objective the tuning sweeper
    # picked its winner by, and the model's FLOPs of one forward pass over the step's samples (forward-pass
    # equivalents, MFU)
    "eval_every",
    "eval_resolution",
    "eval_time_s",  # the held-out evaluations' own seconds, left out of wall_to_target_s as AlgoPerf leaves them
    "eval_examples",  # the held-out examples evaluated (num_eval less num_eval % batch_size): a target's sample
    "eval_fingerprint",  # their bytes (data.fingerprint): trials on other held-out examples meet another target
    "tune_objective",
    "flops_forward",
    "tune_stop_after",  # the tuning sweeper's adaptive cap: the steps the search trial's group's best took
    # on a GPU, hardware FLOPs utilisation: the counted FLOPs' rate (remat's recomputation, jvp's tangents, torch's
    # zero tangents included) over the published peak, beside mfu's model FLOPs (docs/time.md)
    "hfu",
    # what a step launches, and the host's share of it (docs/time.md; bench/<framework>_impl/kernels.py)
    "kernels_per_step",
    "kernels_method",
    "no_kernel_dispatches_per_step",
    "host_share",
    "host_share_method",
    "compile_cache",  # JAX: hit | miss | partial | off, the compiled programs read from the persistent cache or not
    # a target that holds (docs/cost-to-target.md): evaluations in a row that met it (empty: 1, before the column),
    # the steps to easier values on the way ("0.3:40;0.35:;0.4:120"), and steps x the forward passes a step runs
    # as its estimator declares them, beside the report's FLOP equivalents (flops_per_step / flops_forward)
    "target_hold",
    "levels_to_target",
    "passes_to_target",
    # energy over the timed steps, evaluations left out, from the device's own counter (NVML's total energy on a
    # GPU, RAPL's packages on a CPU; empty with energy_method saying why where there is none): docs/energy.md
    "energy_method",
    "energy_devices",
    "energy_timed_j",
    "energy_per_step_j",
    "power_avg_w",
    "power_limit_w",
    "energy_to_target_j",
    "xla_autotune_level",  # JAX on a GPU: XLA:GPU's autotuning level where a trial set it (0: off); empty: XLA's own
)
# each estimator's settings (bench/estimators/<name>.py): NAME_<setting>, those not named above at the end
SETTING_COLUMNS = tuple(c for c in estimators.setting_columns() if c not in REQUIRED_COLUMNS + EXTRA_COLUMNS)
COLUMNS = REQUIRED_COLUMNS + EXTRA_COLUMNS + SETTING_COLUMNS
