"""PyInstaller entry point: the `ponder` console script (app.main.main calls multiprocessing.freeze_support first)."""
from app.main import main

raise SystemExit(main())
