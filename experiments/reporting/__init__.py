"""Pure reporting: stored rows in, markdown tables and PNG plots out (never runs or stores a measurement)."""
