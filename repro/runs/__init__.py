"""A run, for both drivers: the run core, the run folder's life, the run log."""
