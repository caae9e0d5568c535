"""The `ponder` command line, one module per command group: ask, models (with setup and quantize), adapters,
train (and eval), bench, serve. `ponder` with no command opens the window (app.main).

Flags and JSON field names here are relied on by scripts: keep them stable.
"""
from __future__ import annotations

import argparse
import os
import sys

from models.errors import InvalidModelId, ModelError

from . import adapters, ask, bench, models, serve, train
from .args import Parser

OWN_FLAGS = {"train": train.cmd_train, "eval": train.cmd_eval, "bench": bench.cmd_bench}
"""Commands whose subcommands own their flags: the rest of the line is theirs."""


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="ponder",
        description="Ponder: an offline reasoning assistant running a quantized Qwen2.5 on this computer. "
                    "Run without a command to open the desktop window.",
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    ask.add_parser(sub)
    models.add_parsers(sub)
    adapters.add_parser(sub)
    train.add_parsers(sub)
    bench.add_parser(sub)
    serve.add_parser(sub)
    return p


def _fail(err: Exception, code: int) -> int:
    print(f"ponder: {err}", file=sys.stderr)
    return code


def run_cli(argv: list[str]) -> int:
    try:
        return _run(argv)
    except BrokenPipeError:  # stdout closed early (`ponder ask … | head -1`): end quietly, as `head`'s writer would
        try:  # the interpreter's last flush of stdout would fail again, with a notice on stderr
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (AttributeError, OSError, ValueError):  # no file behind sys.stdout
            pass
        return PIPE_CLOSED


PIPE_CLOSED = 141
"""Exit code when stdout was closed under us: 128 + SIGPIPE, what a shell reports for a command that signal ends."""


def _run(argv: list[str]) -> int:
    parser = build_parser()
    if argv and argv[0] in OWN_FLAGS:
        if argv[0] != "eval" and argv[1:] in (["-h"], ["--help"]):
            parser.parse_args(argv)  # the group's help, listing what it runs; exits
        try:
            return OWN_FLAGS[argv[0]](argv[1:])
        except (ModelError, FileNotFoundError) as err:
            return _fail(err, 1)
        except ValueError as err:
            return _fail(err, 2)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    handlers = {"ask": ask.cmd_ask, "models": models.cmd_models, "setup": models.cmd_setup,
                "quantize": models.cmd_quantize, "serve": serve.cmd_serve, "adapters": adapters.cmd_adapters}
    try:
        return handlers[args.command](args)
    except InvalidModelId as err:  # a usage error, like any other bad value
        return _fail(err, 2)
    except ModelError as err:
        return _fail(err, 1)
    except ValueError as err:
        return _fail(err, 2)
