"""Application layer: CLI commands, Qt services and the composition root. Imports core, never ui (but main.py)."""
import os

os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")  # before torch loads: see models/__init__.py
