"""The deterministic delay simulator: its driver, cost model and replay."""
