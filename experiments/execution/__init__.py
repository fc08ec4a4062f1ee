"""Running jobs: plans resumed by key, one process per run, the worker those processes start, paired weights,
and the measurements that the worker runs (overhead, inference, loader, diagnosis, device)."""
