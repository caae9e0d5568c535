"""Application layer: CLI commands, Qt services and the composition root. Imports core, never ui (but main.py)."""
