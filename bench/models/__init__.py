"""Model families, as plug-ins: one framework-neutral module each (bench/models/<family>.py: its spec, parameter
names and shapes as HF names them, what each trainable scope selects, its LoRA targets), beside one model module
per framework (bench/torch_impl/models/<family>.py, bench/jax_impl/models/<family>.py)."""
