"""Qt widgets only. Services (app.*) are injected by constructor; from core only the value types of core.events
and core.config are imported, and the chat database is reached only through the ChatController."""
