"""`ponder serve`: the OpenAI-compatible server (app.server) on a model loaded here, until Ctrl+C."""
from __future__ import annotations

import sys

from core.config import EngineConfig
from models.registry import DEFAULT_MODEL_ID, default_budget

from .args import whole


def add_parser(sub) -> None:
    serve = sub.add_parser("serve", help="serve the OpenAI-compatible API (/v1/chat/completions, ...) locally")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this computer only)")
    serve.add_argument("--port", type=whole(0, 65535), default=8080, help="port (default 8080; 0 picks a free one)")
    serve.add_argument("--api-key", default=None,
                       help="require 'Authorization: Bearer KEY' (default: $PONDER_API_KEY, or no key; "
                            "required off 127.0.0.1)")
    serve.add_argument("--allow-origin", action="append", default=[], metavar="ORIGIN",
                       help="a web origin whose pages may call the API (e.g. http://myui.example; '*' for any; "
                            "repeatable). This computer's own origins are always allowed")
    serve.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                       help="another name this server is reached by (checked against the Host header; repeatable)")
    serve.add_argument("--model", default=DEFAULT_MODEL_ID, help=f"installed model id (default {DEFAULT_MODEL_ID})")
    serve.add_argument("--max-tokens-limit", type=whole(1), default=4096,
                       help="largest max_tokens / thinking_budget a request may ask for (default 4096)")
    serve.add_argument("--threads", type=whole(1, 1024), default=None, help="CPU threads (default: physical cores)")
    serve.add_argument("--max-batch", type=whole(1, 16), default=4,
                       help="requests decoded together; more wait in line (default 4; 1: one at a time)")


def cmd_serve(args) -> int:
    import os

    from core.loading import load_engine

    from ..engine_worker import EngineWorker
    from ..openai_schema import Limits
    from ..progress import TerminalProgress
    from ..server import API_KEY_ENV, LocalServer

    api_key = args.api_key or os.environ.get(API_KEY_ENV) or None
    worker = EngineWorker(max_batch=args.max_batch)
    try:
        server = LocalServer(worker, host=args.host, port=args.port, api_key=api_key,
                             limits=Limits(max_tokens=args.max_tokens_limit,
                                           default_thinking_budget=default_budget(args.model)), log_level="info",
                             allow_hosts=tuple(args.allow_host), allow_origins=tuple(args.allow_origin))
    except OSError as err:
        print(f"ponder serve: cannot listen on {args.host}:{args.port}: {err.strerror or err}", file=sys.stderr)
        return 1
    except ValueError as err:
        print(f"ponder serve: {err}", file=sys.stderr)
        return 2
    bar = TerminalProgress()
    cfg = EngineConfig(model_id=args.model, threads=args.threads)
    try:  # loaded on the engine thread: torch's thread settings are per thread
        worker.engine = worker.submit(load_engine, cfg, progress=bar).result()
    finally:
        bar.close()
    for warning in worker.engine.warnings:
        print(f"ponder: warning: {warning}", file=sys.stderr)
    print(f"Serving {worker.engine.model_id} at {server.url} (OpenAI API; Ctrl+C stops)", file=sys.stderr, flush=True)
    try:
        server.run()
    except KeyboardInterrupt:  # uvicorn shut down gracefully, then re-raised the signal
        pass
    finally:
        worker.shutdown(wait=False)
    print("Stopped.", file=sys.stderr)
    return 0
