"""The driver: the only package that may import both framework implementations."""
