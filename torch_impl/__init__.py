"""PyTorch side of twinrun. Never imports jax_impl."""
