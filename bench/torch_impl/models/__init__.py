"""Each model family's torch model (bench/models/<family>.py declares the family): built through HF transformers,
loaded with weights by HF name. Mirror of jax_impl/models/."""
