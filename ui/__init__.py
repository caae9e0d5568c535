"""Qt widgets only. Services are injected by constructor; nothing here imports core.engine or core.loading."""
