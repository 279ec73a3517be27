"""``hf2q convert SRC OUT.gguf``: the subcommand (registered by
:func:`hf2q.cli.build_parser`; errors and ``--json`` failures go through
the CLI's common handling)."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def add_parser(sub: Any, add_source: Any) -> None:
    """Register ``convert`` on the CLI's subparsers (``add_source``: the
    CLI's PATH_OR_REPO / --revision / --download / --json arguments)."""
    from . import OUTTYPES

    p = sub.add_parser(
        "convert", help="write the GGUF file llama.cpp's convert_hf_to_gguf.py writes (Qwen3.5/3.6 MoE, Gemma 4)",
        description="Write the GGUF file that llama.cpp's convert_hf_to_gguf.py --outtype OUTTYPE writes for "
                    "the checkpoint: the same tensors, types, shapes, bytes and order, the same "
                    "hyper-parameter keys. The file is streamed (bounded memory), written under a temporary "
                    "name in OUT's folder and renamed when complete.")
    add_source(p, "a checkpoint folder, a .safetensors file or index, or a Hugging Face repo id in the local cache")
    p.add_argument("out", metavar="OUT.gguf", help="the GGUF file to write")
    p.add_argument("--outtype", choices=list(OUTTYPES), default="q8_0",
                   help="as for llama.cpp's converter: the type of the weight matrices (norms, routers and 1-D "
                        "tensors stay F32); default q8_0")
    p.add_argument("--expert-dtype", choices=["q8_0", "bf16", "f32"],
                   help="Qwen3.5/3.6 MoE, Gemma 4: the expert stacks' type (default: --outtype)")
    p.add_argument("--dense-dtype", choices=["f32", "bf16", "q8_0"],
                   help="Qwen3.5/3.6 MoE, Gemma 4: the other matrices' type (default: --outtype)")
    p.add_argument("--no-mtp", action="store_true",
                   help="Qwen3.5/3.6 MoE: leave the multi-token-prediction block out (the converter's --no-mtp)")
    p.add_argument("--name", help="general.name (default: the checkpoint folder's name, as the converter does)")
    p.add_argument("--force", action="store_true", help="replace OUT.gguf if it exists")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (drawn only on a terminal anyway)")
    p.set_defaults(func=cmd_convert)


def cmd_convert(args: argparse.Namespace) -> int:
    from .. import cli
    from . import convert

    path = cli.resolve_source(args)
    options: dict[str, Any] = {}
    if args.expert_dtype:
        options["expert_dtype"] = args.expert_dtype
    if args.dense_dtype:
        options["dense_dtype"] = args.dense_dtype
    if args.no_mtp:
        options["mtp"] = False
    try:
        summary = convert(path, args.out, args.outtype, force=args.force,
                          progress=not (args.no_progress or args.json), name=args.name or _default_name(args),
                          **options)
    except TypeError as e:  # an option this family does not take
        raise cli.UsageError(str(e)) from None
    d = summary.as_dict()
    if args.json:
        cli.emit_json(d)
    else:
        from .._progress import format_bytes

        print(f"{d['output']}: {d['architecture']} ({d['outtype']}), {d['tensors']} tensors, "
              f"{format_bytes(d['bytes'])} in {d['seconds']:.2f} s ({d['gb_per_s']:.2f} GB/s); "
              f"tokenizer: {d['tokenizer']}", file=sys.stdout)
    return 0


def _default_name(args: argparse.Namespace) -> str | None:
    """A repo id names the model as the converter names a remote one: the id."""
    import os

    p = args.path
    return p if not os.path.exists(p) and "/" in p and not p.startswith((".", "/")) else None
