"""Engine layer: pure Python + torch, no Qt and no event loop. Imports `models` only."""
import os

os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")  # before torch loads: see models/__init__.py
