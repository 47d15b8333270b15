"""The engine: entry point, step loop, run artefacts, sweeps and reviews."""

import warnings

# Paddle warns at import that it found no compiler cache; nothing here compiles extensions.
warnings.filterwarnings("ignore", message="No ccache found")
