"""What is trained: data, models, the builders, evaluation sets, the warm start."""
