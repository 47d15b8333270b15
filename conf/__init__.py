"""Hydra config groups, shipped inside the package as `pipeline.conf`."""
