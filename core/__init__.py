"""Engine layer: pure Python + torch, no Qt and no event loop. Imports `models` only."""
