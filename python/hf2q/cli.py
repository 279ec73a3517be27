"""The ``hf2q`` command line: inspect, load, demo."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from .errors import CacheError, ConfigError, Hf2qError


def detect_architecture(path: Path) -> str:
    """The registry name of the family that loads the checkpoint at ``path``
    (``"dflash"``, ``"qwen35moe"``, else ``"generic"``), from its ``config.json``."""
    from .models import detect, read_config

    return detect(read_config(path)[1]).name


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return str(n)


def cmd_inspect(args: argparse.Namespace) -> int:
    from . import models
    from .safetensors import open_checkpoint

    path = Path(args.path)
    _, config = models.read_config(path)  # read once, handed to the family
    with open_checkpoint(path) as ckpt:  # headers parsed once
        rows = [
            {"name": n, "dtype": ckpt[n].dtype, "shape": list(ckpt[n].shape), "bytes": ckpt[n].nbytes}
            for n in ckpt.keys()
        ]
        total = ckpt.total_data_bytes()
        files = [str(getattr(f, 'path', f)) for f in ckpt.files]
        fam, plan = models.inspect(ckpt, config, **_family_options(args))
    arch = fam.name
    report: dict[str, Any] = {"path": str(path), "architecture": arch, "files": files, "tensors": len(rows),
                              "data_bytes": total}
    device_dtypes = plan.pop("device_dtypes", None)
    report.update(plan)
    if device_dtypes is not None:
        for r in rows:
            r["device_dtype"] = device_dtypes.get(r["name"])
    report["tensor_list"] = rows
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"{path}: {arch}, {len(rows)} tensors in {len(files)} file(s), {total:,} data bytes ({_human(total)})")
    if "gpu_resident_bytes" in report:
        print(f"device-resident bytes: {report['gpu_resident_bytes']:,}")
    width = max((len(r["name"]) for r in rows), default=4)
    for r in rows:
        dev = f"  -> {r['device_dtype']}" if r.get("device_dtype") else ""
        print(f"  {r['name']:<{width}}  {r['dtype']:<5} {str(tuple(r['shape'])):<22} {r['bytes']:>14,}{dev}")
    return 0


def _device(kind: str | None) -> Any:
    from .device import Device

    return Device.default() if kind in (None, "auto") else Device(kind)


def _print_summary(summary: Any, as_json: bool, verify: dict[str, Any] | None) -> None:
    d = summary.as_dict()
    if verify is not None:
        d["verify"] = verify
    if as_json:
        print(json.dumps(d, indent=2))
        return
    res = d["residency"]
    print(f"model:            {d['model']}")
    print(f"device:           {d['device']}")
    print(f"tensors:          {d['tensors']}")
    print(f"resident bytes:   {d['resident_bytes']:,} ({_human(d['resident_bytes'])})")
    print(f"load time:        {d['seconds']:.3f} s ({d['gb_per_s']:.2f} GB/s of checkpoint data)")
    state = "disabled" if not res["enabled"] else (
        f"{res['buffers']} buffers in {res['sets']} set(s), {_human(res['allocated_size'])} allocated, "
        f"{_human(res['locked_bytes'])} locked"
        + (f", {_human(res['unwired_bytes'])} over the wired budget" if res["unwired_bytes"] else "")
    )
    print(f"residency:        {state}")
    for k, v in d.items():
        if k not in ("model", "device", "tensors", "resident_bytes", "data_bytes", "seconds", "gb_per_s",
                     "residency", "verify"):
            print(f"{k + ':':<18}{v}")
    if verify is not None:
        print(f"verify:           {verify['buffers']} buffers read back through the device, "
              f"{verify['groups']:,} checksum groups equal ({verify['seconds']:.2f} s)")


def _family_options(args: argparse.Namespace) -> dict[str, Any]:
    """The family options given on the command line (the registry passes each
    family only the ones it takes)."""
    return {k: getattr(args, k) for k in ("expert_dtype", "dense_dtype", "dtype") if getattr(args, k, None) is not None}


def _load(path: Path, device: Any, progress: bool, args: argparse.Namespace) -> Any:
    from . import models

    if not path.exists():
        raise ConfigError(f"{path}: no such file or directory")
    _, config = models.read_config(path)
    fam = models.detect(config)
    opts = {k: v for k, v in _family_options(args).items() if k in fam.options}
    return models.load_with(path, config, fam, device, progress=progress, **opts)  # config.json read once


def cmd_load(args: argparse.Namespace) -> int:
    device = _device(args.device)
    if args.drafter:
        return _load_pair(args, device)
    model = _load(Path(args.path), device, not args.json and not args.no_progress, args)
    verify = model.verify() if args.verify else None
    _print_summary(model.summary, args.json, verify)
    return 0


def _load_pair(args: argparse.Namespace, device: Any) -> int:
    """``hf2q load TARGET --drafter DRAFTER``: both halves checked, then
    loaded as a bound pair (hf2q.pairs); prints both summaries and the pair's."""
    from . import models, pairs

    path = Path(args.path)
    if not path.exists():
        raise ConfigError(f"{path}: no such file or directory")
    fam = models.detect(models.read_config(path)[1])
    opts = {k: v for k, v in _family_options(args).items() if k in fam.options}
    pair = pairs.load_pair(path, args.drafter, device, progress=not args.json and not args.no_progress, **opts)
    verify = pair.verify() if args.verify else None
    if args.json:
        out = {"target": pair.target.summary.as_dict(), "drafter": pair.drafter.summary.as_dict(),
               "pair": pair.summary(), **({"verify": verify} if verify else {})}
        print(json.dumps(out, indent=2))
        return 0
    _print_summary(pair.target.summary, False, None)
    print()
    _print_summary(pair.drafter.summary, False, verify)
    return 0


def demo_cache_dir() -> Path:
    base = os.environ.get("HF2Q_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "hf2q"
    )
    return Path(base)


def cmd_demo(args: argparse.Namespace) -> int:
    """Write a synthetic drafter once into ``<cache>/demo-<config>-dflash``
    (``<cache>``: ``--cache-dir``, else :func:`demo_cache_dir`) and load it.

    The drafter is the full-size gemma-4-26B-A4B one (859 MB) unless the
    hidden ``--config NAME`` option or the ``HF2Q_DEMO_CONFIG`` environment
    variable names another config of ``hf2q.dflash.DRAFTER_CONFIGS`` (tests
    use ``tiny``). Only that sub-folder is ever replaced, never the cache
    folder itself."""
    from . import dflash

    config = args.config or os.environ.get("HF2Q_DEMO_CONFIG") or None
    if config == "gemma-4-26B-A4B-it":
        config = None  # the default drafter
    if config is not None and config not in dflash.DRAFTER_CONFIGS:
        raise ConfigError(f"unknown demo config {config!r}; known: {', '.join(sorted(dflash.DRAFTER_CONFIGS))}")
    base = Path(args.cache_dir) if args.cache_dir else demo_cache_dir()
    target = base / ("demo-gemma-4-26B-A4B-dflash" if config is None else f"demo-{config}-dflash")
    try:
        _fill_demo_cache(base, target, config)
    except OSError as e:
        raise CacheError(f"demo cache {base}: {e.strerror or e}"
                         + (f": {e.filename}" if getattr(e, "filename", None) else "")) from None
    device = _device(args.device)
    model = dflash.load(target, device=device, progress=not args.json)
    verify = model.verify() if not args.no_verify else None
    _print_summary(model.summary, args.json, verify)
    return 0


def _fill_demo_cache(base: Path, target: Path, config: str | None) -> None:
    from .testing import make_dflash_checkpoint

    if base.exists() and not base.is_dir():
        raise NotADirectoryError(20, "not a directory", str(base))
    if not (target / ".complete").is_file():
        what = ("the full-size synthetic gemma-4-26B-A4B DFlash drafter (859 MB)" if config is None
                else f"the synthetic {config} DFlash drafter")
        print(f"hf2q demo: writing {what} to {target}", file=sys.stderr)
        tmp = target.with_name(target.name + f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        make_dflash_checkpoint(tmp, config)
        (tmp / ".complete").write_text("ok\n")
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)
    else:
        print(f"hf2q demo: using the cached synthetic drafter in {target}", file=sys.stderr)


def build_parser() -> argparse.ArgumentParser:
    from . import __version__, _core

    parser = argparse.ArgumentParser(
        prog="hf2q",
        description="HuggingFace safetensors checkpoints to inference-ready weights in device memory.",
    )
    parser.add_argument("--version", action="version", version=f"hf2q {__version__}")
    devices = ["auto", *_core.backend_kinds()]  # the native backend registry
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("inspect", help="list a checkpoint's tensors, dtypes, shapes and bytes")
    p.add_argument("path", help="safetensors file or checkpoint directory")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--dtype", default="keep", choices=["keep", "f32", "bf16", "q8_0"],
                   help="generic checkpoints: the dtype policy whose device dtypes to show")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("load", help="validate a checkpoint and make it resident on a device")
    p.add_argument("path", help="checkpoint directory (with config.json) or safetensors file")
    p.add_argument("--device", choices=devices, default="auto")
    p.add_argument("--json", action="store_true", help="machine-readable summary")
    p.add_argument("--verify", action="store_true", help="read every buffer back through the device")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--drafter", metavar="DRAFTER", help="a DFlash drafter to load bound to this target "
                   "(its embedding and LM head become the target's buffers)")
    p.add_argument("--expert-dtype", default="q8_0", choices=["q8_0", "bf16", "f32"],
                   help="Qwen3.5 MoE, Gemma 4: dtype of the expert stacks")
    p.add_argument("--dense-dtype", default="f32", choices=["f32", "bf16", "q8_0"],
                   help="Qwen3.5 MoE, Gemma 4: dtype of the dense weights")
    p.add_argument("--dtype", default="keep", choices=["keep", "f32", "bf16", "q8_0"],
                   help="generic checkpoints (no known architecture): keep each tensor's dtype, or convert "
                   "floats as llama.cpp's --outtype would (q8_0: 2-D weights whose rows are whole 32-blocks)")
    p.set_defaults(func=cmd_load)

    p = sub.add_parser("demo", help="load a full-size synthetic DFlash drafter (written once to a cache folder)")
    p.add_argument("--device", choices=devices, default="auto")
    p.add_argument("--cache-dir", help="folder that keeps the synthetic checkpoint, in a sub-folder "
                   "(default $HF2Q_CACHE or ~/.cache/hf2q)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--no-verify", action="store_true", help="skip the read-back verification")
    p.add_argument("--config", help=argparse.SUPPRESS)  # another drafter config (tests: tiny); or HF2Q_DEMO_CONFIG
    p.set_defaults(func=cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    try:
        return int(args.func(args))
    except (Hf2qError, OSError) as e:  # bad input: one line (OSError: a path the OS refused), exit 2
        print(f"hf2q {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"hf2q {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
