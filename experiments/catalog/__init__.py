"""What the driver can run, as data: presets, the ladder's rungs, the sweeps, published figures, default data."""
