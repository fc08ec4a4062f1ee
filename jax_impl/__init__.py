"""JAX/Flax side of twinrun. Never imports torch_impl."""
