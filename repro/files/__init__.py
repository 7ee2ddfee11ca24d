"""The run folder's files: schema, locks, atomic writes, checkpoints (no training here)."""
