"""A simulated device: model specs without weights, hardware profiles and a step cost model."""
