"""`ponder train …` and `ponder eval`: each trainer owns its flags (`ponder train sft --help`)."""
from __future__ import annotations

import sys

TRAINERS = ("sft", "distill", "rl", "caprese", "cats", "switcher", "verifier")


def add_parsers(sub) -> None:
    train = sub.add_parser("train", help="train adapters and heads (sft: reasoning LoRA adapter)")
    tsub = train.add_subparsers(dest="train_command", metavar="WHAT")
    tsub.add_parser("sft", help="reasoning LoRA adapter by masked SFT (run `ponder train sft --help`)", add_help=False)
    tsub.add_parser("distill", help="reasoning traces by rejection sampling from a teacher (`--help`)",
                    add_help=False)
    tsub.add_parser("rl", help="budget-forcing RL of a reasoning adapter (run `ponder train rl --help`)",
                    add_help=False)
    tsub.add_parser("caprese", help="low-rank branches that recover sparse decoding's accuracy (`--help`)",
                    add_help=False)
    tsub.add_parser("cats", help="calibrate CATS's per-layer activation thresholds (`--help`)", add_help=False)
    tsub.add_parser("switcher", help="the reasoning-needed classifier head", add_help=False)
    tsub.add_parser("verifier", help="the answer-correctness head", add_help=False)
    sub.add_parser("eval", help="accuracy, tokens and latency on a GSM8K/MATH file (`ponder eval --help`)",
                   add_help=False)


def cmd_train(argv: list[str]) -> int:
    if not argv or argv[0] not in TRAINERS:
        print("ponder train: choose what to train: sft, distill, rl, caprese, cats, switcher or verifier",
              file=sys.stderr)
        return 2
    if argv[0] == "distill":
        from core.training.distill import main as distill_main

        return distill_main(argv[1:])
    if argv[0] in ("caprese", "cats"):
        from core.training.sparse_fit import train_caprese as caprese_main
        from core.training.sparse_fit import train_cats as cats_main

        return (caprese_main if argv[0] == "caprese" else cats_main)(argv[1:])
    if argv[0] == "rl":
        from core.training.rl_cli import main as rl_main

        return rl_main(argv[1:])
    if argv[0] == "sft":
        from core.training.sft import main as train_main
    else:
        from core.training.head_cli import main as head_main

        return head_main(argv)
    return train_main(argv[1:])


def cmd_eval(argv: list[str]) -> int:
    from core.evaluation.evaluate import main as eval_main

    return eval_main(argv)
