"""Each model family's JAX model (bench/models/<family>.py declares the family): our own Flax NNX module, its
layers one scan, loaded with weights by HF name. Mirror of torch_impl/models/."""
