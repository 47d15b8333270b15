"""The engine: entry point, step loop, run artefacts, sweeps and reviews."""
