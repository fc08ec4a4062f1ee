"""Framework-free core of twinrun: config, data, timing, results. Imports neither torch nor jax."""
