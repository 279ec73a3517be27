"""The ``hf2q`` command line: inspect, load, demo, convert.

Layout (each part is one block below): naming a checkpoint (local path or
Hugging Face repo id), architecture detection, output for people (units: see
:mod:`hf2q._progress`) and for machines (``--json``), the commands, errors,
the parser, ``main``.

``--json``: on success stdout holds one JSON object (the command's report);
on failure stdout holds ``{"error": {...}}`` (see :func:`error_object`) and
nothing is printed on stderr. The exit status is the same either way.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any, NoReturn, Sequence

from ._progress import format_bytes
from .errors import ConfigError, Hf2qError, SafetensorsError

DEFAULT_DEMO_CONFIG = "gemma-4-26B-A4B-it"
COMMANDS = ("inspect", "load", "demo", "convert")

# =========================================================================== naming a checkpoint


def resolve_source(args: argparse.Namespace) -> Path:
    """The local checkpoint that ``args.path`` names: a path, or a Hub repo
    id resolved through the local Hugging Face cache (``--revision``;
    ``--download`` to fetch). A missing path fails here, worded the same for
    every command."""
    from . import hub

    try:
        path = hub.resolve(args.path, args.revision, download=args.download, command=args.command)
    except ValueError as e:  # --revision/--download with a local path
        raise UsageError(str(e)) from None
    if not os.path.lexists(path):
        raise SafetensorsError(f"{path}: no such file or directory", code="Io", path=str(path))
    return path


def detect_architecture(path: Path) -> str:
    """The registry name of the family that loads the checkpoint at ``path``
    (``"dflash"``, ``"qwen35moe"``, ``"gemma4"``, else ``"generic"``), from its ``config.json``."""
    from .models import detect, read_config

    return detect(read_config(path)[1]).name


# =========================================================================== output


def emit_json(obj: Any) -> None:
    print(json.dumps(obj, indent=2))


def _seconds(s: float) -> str:
    return f"{s:.2f} s"


def print_summary(d: dict[str, Any]) -> None:
    """The load summary (``LoadSummary.as_dict()`` plus ``verify``) for people."""
    res = d["residency"]
    print(f"model:            {d['model']}")
    print(f"device:           {d['device']}")
    print(f"tensors:          {d['tensors']}")
    print(f"resident bytes:   {d['resident_bytes']:,} ({format_bytes(d['resident_bytes'])})")
    print(f"load time:        {_seconds(d['seconds'])} ({d['gb_per_s']:.2f} GB/s of checkpoint data, "
          f"{format_bytes(d['data_bytes'])})")
    if not res["enabled"]:
        state = "off (HF2Q_NO_RESIDENCY=1)" if os.environ.get("HF2Q_NO_RESIDENCY") == "1" else "off"
    else:
        state = (f"{res['buffers']} of the model's buffers in the residency set, "
                 f"{format_bytes(res['allocated_bytes'])} allocated, {format_bytes(res['locked_bytes'])} locked")
        if res["unwired_bytes"]:
            state += f", {format_bytes(res['unwired_bytes'])} over the wired budget"
    print(f"residency:        {state}")
    for k, v in d.items():
        if k not in ("model", "device", "tensors", "resident_bytes", "data_bytes", "seconds", "gb_per_s",
                     "residency", "verify"):
            print(f"{k.replace('_', ' ') + ':':<18}{v}")
    if "verify" in d:
        v = d["verify"]
        print(f"verify:           {v['buffers']} buffers read back through the device, "
              f"{v['groups']:,} checksum groups equal ({_seconds(v['seconds'])})")


def note(args: argparse.Namespace, text: str) -> None:
    """A line for people on stderr (``hf2q demo`` says what it does)."""
    print(f"hf2q {args.command}: {text}", file=sys.stderr)


# =========================================================================== inspect


def cmd_inspect(args: argparse.Namespace) -> int:
    from . import models
    from .safetensors import open_checkpoint

    path = resolve_source(args)
    _, config = models.read_config(path)  # read once, handed to the family
    with open_checkpoint(path) as ckpt:  # headers parsed once
        rows = [
            {"name": n, "dtype": ckpt[n].dtype, "shape": list(ckpt[n].shape), "bytes": ckpt[n].nbytes}
            for n in ckpt.keys()
        ]
        total = ckpt.total_data_bytes()
        files = [str(getattr(f, "path", f)) for f in ckpt.files]
        fam = models.detect(config)
        fam, plan = models.inspect(ckpt, config, family=fam.name, **_options_for(fam, path, args))
    arch = fam.name
    report: dict[str, Any] = {"path": str(path), "architecture": arch, "files": files, "tensors": len(rows),
                              "data_bytes": total}
    if args.path != str(path):  # a repo id
        report["repo_id"] = args.path
        report["revision"] = args.revision or "main"
    device_dtypes = plan.pop("device_dtypes", None)
    if "gpu_resident_bytes" in plan:  # the model API's name; the report says what it is
        plan["resident_bytes"] = plan.pop("gpu_resident_bytes")
    report.update(plan)
    if device_dtypes is not None:
        for r in rows:
            r["device_dtype"] = device_dtypes.get(r["name"])
    report["tensor_list"] = rows
    if args.json:
        emit_json(report)
        return 0
    name = f"{report['repo_id']}@{report['revision']} ({path})" if "repo_id" in report else str(path)
    print(f"{name}: {arch}, {len(rows)} tensors in {len(files)} file(s), {total:,} data bytes ({format_bytes(total)})")
    if "resident_bytes" in report:
        print(f"resident bytes: {report['resident_bytes']:,} ({format_bytes(report['resident_bytes'])})")
    width = max((len(r["name"]) for r in rows), default=4)
    for r in rows:
        dev = f"  -> {r['device_dtype']}" if r.get("device_dtype") else ""
        print(f"  {r['name']:<{width}}  {r['dtype']:<5} {str(tuple(r['shape'])):<22} {r['bytes']:>14,}{dev}")
    return 0


# =========================================================================== load


def open_device(kind: str | None) -> Any:
    """The device asked for, opened before any work (``metal`` where there
    is none fails here, with nothing written or read)."""
    from .device import Device

    return Device.default() if kind in (None, "auto") else Device(kind)


def _cli_options() -> dict[str, Any]:
    """The family options the command line offers (``inspect`` and ``load``),
    as each family declares them (:class:`hf2q.models.base.Option`): loader
    keyword -> (option, the families that take it), in registry order."""
    from . import models

    out: dict[str, Any] = {}
    for fam in models.FAMILIES:
        impl = fam.impl()
        for o in impl.options:
            if o.cli:
                out.setdefault(o.name, (o, []))[1].append(impl)
    return out


def _flag(option: str) -> str:
    return "--" + option.replace("_", "-")


def _family_options(args: argparse.Namespace) -> dict[str, Any]:
    """The family options given on the command line."""
    return {k: getattr(args, k) for k in _cli_options() if getattr(args, k, None) is not None}


def _options_for(fam: Any, path: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The options the family takes; one given that it does not take is a
    usage error naming the flag and the family (not silently dropped)."""
    given = _family_options(args)
    foreign = [_flag(k) for k in given if k not in fam.options]
    if foreign:
        verb = "does" if len(foreign) == 1 else "do"
        offered = [_flag(o.name) for o in fam.option_specs if o.cli]  # not the Python-only ones (mtp)
        raise UsageError(f"{' and '.join(foreign)} {verb} not apply to {path}: the {fam.name} family takes "
                         f"{', '.join(offered) or 'no options'}")
    return given


def _load_model(path: Path, device: Any, progress: bool, args: argparse.Namespace) -> Any:
    from . import models

    _, config = models.read_config(path)
    fam = models.detect(config)
    return models.load_with(path, config, fam, device, progress=progress,
                            **_options_for(fam, path, args))  # config.json read once


def load_report(model: Any, verify: bool, **extra: Any) -> dict[str, Any]:
    """The load summary, then ``extra`` (where it came from), then the read-back."""
    d: dict[str, Any] = {**model.summary.as_dict(), **extra}
    if verify:
        v = model.verify()
        d["verify"] = {**v, "seconds": round(v["seconds"], 3)}
    return d


def cmd_load(args: argparse.Namespace) -> int:
    device = open_device(args.device)
    path = resolve_source(args)
    if args.drafter:
        return _load_pair(path, args, device)
    model = _load_model(path, device, not args.json and not args.no_progress, args)
    source: dict[str, Any] = {"checkpoint": str(path)}
    if args.path != str(path):  # a repo id
        source.update(repo_id=args.path, revision=args.revision or "main")
    d = load_report(model, args.verify, **source)
    if args.json:
        emit_json(d)
    else:
        print_summary(d)
    return 0


def _load_pair(path: Path, args: argparse.Namespace, device: Any) -> int:
    """``hf2q load TARGET --drafter DRAFTER``: both halves checked, then
    loaded as a bound pair (hf2q.pairs); prints both summaries and the pair's."""
    from . import hub, models, pairs

    drafter = hub.resolve(args.drafter, command=args.command)
    if not os.path.lexists(drafter):
        raise SafetensorsError(f"{drafter}: no such file or directory", code="Io", path=str(drafter))
    _, config = models.read_config(path)
    fam = models.detect(config)
    pair = pairs.load_pair_with(path, config, fam, drafter, device, progress=not args.json and not args.no_progress,
                                **_options_for(fam, path, args))  # config.json read once, the target planned once
    verify = pair.verify() if args.verify else None
    target = {**pair.target.summary.as_dict(), "checkpoint": str(path)}
    drafted = {**pair.drafter.summary.as_dict(), "checkpoint": str(drafter)}
    if args.json:
        emit_json({"target": target, "drafter": drafted, "pair": pair.summary(),
                   **({"verify": verify} if verify else {})})
        return 0
    print_summary(target)
    print()
    print_summary({**drafted, **({"verify": verify} if verify else {})})
    print()
    for k, v in pair.summary().items():
        print(f"{k.replace('_', ' ') + ':':<22}{f'{v:,}' if isinstance(v, int) and not isinstance(v, bool) else v}")
    return 0


# =========================================================================== demo


def demo_cache_dir() -> Path:
    """``$HF2Q_CACHE``, else ``$XDG_CACHE_HOME/hf2q``, else ``~/.cache/hf2q``."""
    base = os.environ.get("HF2Q_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "hf2q"
    )
    return Path(base)


def demo_target(args: argparse.Namespace) -> tuple[Path, str]:
    """(the demo checkpoint's folder, its config name)."""
    from .models.dflash import DRAFTER_CONFIGS

    config = args.config or os.environ.get("HF2Q_DEMO_CONFIG") or DEFAULT_DEMO_CONFIG
    if config not in DRAFTER_CONFIGS:
        raise ConfigError(f"unknown demo config {config!r}; known: {', '.join(sorted(DRAFTER_CONFIGS))}")
    base = Path(args.cache_dir) if args.cache_dir else demo_cache_dir()
    if args.cache_dir and os.path.lexists(base) and not base.is_dir():  # bad input, exit 2 (issue 11)
        raise UsageError(f"--cache-dir {base}: not a directory")
    name = "demo-gemma-4-26B-A4B-dflash" if config == DEFAULT_DEMO_CONFIG else f"demo-{config}-dflash"
    return base / name, config


def _remove_hint(args: argparse.Namespace) -> str:
    extra = f" --cache-dir {args.cache_dir}" if args.cache_dir else ""
    return f"hf2q demo --remove{extra}"


def cmd_demo(args: argparse.Namespace) -> int:
    """Write a synthetic drafter once into ``<cache>/demo-<config>-dflash``
    (``<cache>``: ``--cache-dir``, else :func:`demo_cache_dir`) and load it.

    The drafter is the full-size gemma-4-26B-A4B one (859 MB) unless the
    hidden ``--config NAME`` option or the ``HF2Q_DEMO_CONFIG`` environment
    variable names another config of ``hf2q.dflash.DRAFTER_CONFIGS`` (tests
    use ``tiny``). Only that sub-folder is ever written or removed, never the
    cache folder itself."""
    target, config = demo_target(args)
    if args.remove:
        existed = target.exists()
        shutil.rmtree(target, ignore_errors=True)
        for stale in target.parent.glob(target.name + ".tmp*") if target.parent.is_dir() else ():
            shutil.rmtree(stale, ignore_errors=True)
        if args.json:
            emit_json({"removed": str(target), "existed": existed})
        else:
            note(args, f"removed {target}" if existed else f"nothing to remove: {target} does not exist")
        return 0
    device = open_device(args.device)  # before writing anything
    from . import dflash
    from .dflash import DFlashConfig, expected_total_data_bytes

    size = format_bytes(expected_total_data_bytes(DFlashConfig.from_dict(dflash.DRAFTER_CONFIGS[config])))
    if (target / ".complete").is_file():
        note(args, f"using the cached synthetic drafter ({size}) in {target}; remove it with: {_remove_hint(args)}")
    else:
        from . import testing

        what = (f"the full-size synthetic gemma-4-26B-A4B DFlash drafter ({size})" if config == DEFAULT_DEMO_CONFIG
                else f"the synthetic {config} DFlash drafter ({size})")
        note(args, f"writing {what} to {target} (once)")
        tmp = target.with_name(target.name + f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            testing.make_dflash_checkpoint(tmp, None if config == DEFAULT_DEMO_CONFIG else config,
                                           progress=not args.json)
            (tmp / ".complete").write_text("ok\n")
            shutil.rmtree(target, ignore_errors=True)
            tmp.rename(target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        note(args, f"cached in {target}; remove it with: {_remove_hint(args)}")
    model = dflash.load(target, device=device, progress=not args.json)
    d = load_report(model, not args.no_verify, checkpoint=str(target))
    if args.json:
        emit_json(d)
    else:
        print_summary(d)
    return 0


# =========================================================================== errors


class UsageError(Exception):
    """The command line itself is wrong (argparse's errors and options that
    do not fit the checkpoint); exit status 2."""

    def __init__(self, message: str, usage: str = "") -> None:
        super().__init__(message)
        self.usage = usage


def error_object(e: BaseException) -> dict[str, Any]:
    """What ``--json`` prints on failure: ``{"error": {"type", "message",
    ...}}`` with ``code``, ``path``, ``tensor``, ``key``, ``repo_id``,
    ``revision``, ``hint`` where the error has them (``type``: the exception
    class name, e.g. ``SafetensorsError``; ``"UsageError"`` for a wrong
    command line)."""
    err: dict[str, Any] = {"type": type(e).__name__, "message": str(e)}
    if isinstance(e, OSError) and not isinstance(e, Hf2qError):  # the system's error: say which file
        err["message"] = str(e.strerror or e)
        if e.filename:
            err["path"] = str(e.filename)
    for attr in ("code", "path", "tensor", "key", "repo_id", "revision", "hint"):
        v = getattr(e, attr, None)
        if isinstance(v, (str, int)) and not isinstance(v, bool) and attr not in err:
            err[attr] = v
    problems = getattr(e, "problems", None)
    if problems:
        err["problems"] = [{"kind": p.kind, "tensor": p.tensor, "expected": p.expected, "actual": p.actual}
                           for p in problems]
    return {"error": err}


def exit_code(e: BaseException) -> int:
    """2 for bad input or a wrong command line, 1 for anything else (the
    system: a cache folder that cannot be written, a download that failed on
    the network or the server, :class:`hf2q.hub.HubNetworkError`)."""
    from .hub import HubNetworkError

    if isinstance(e, HubNetworkError):
        return 1
    return 2 if isinstance(e, (Hf2qError, UsageError)) else 1


def report_error(command: str | None, e: BaseException, as_json: bool) -> int:
    if as_json:
        emit_json(error_object(e))
    elif isinstance(e, UsageError):
        if e.usage:
            print(e.usage, end="" if e.usage.endswith("\n") else "\n", file=sys.stderr)
        print(f"hf2q{' ' + command if command else ''}: error: {e}", file=sys.stderr)
    elif isinstance(e, OSError) and not isinstance(e, Hf2qError):
        where = f"{e.filename}: " if e.filename else ""
        print(f"hf2q {command}: error: {where}{e.strerror or e}", file=sys.stderr)
    else:
        print(f"hf2q {command}: error: {e}", file=sys.stderr)
    return exit_code(e)


# =========================================================================== parser


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors raised (so that ``--json`` can report them as JSON)."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message, self.format_usage())


def _add_source(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("path", metavar="PATH_OR_REPO", help=what)
    p.add_argument("--revision", metavar="REV",
                   help="repo ids: branch, tag or commit hash in the Hugging Face cache (default: main)")
    p.add_argument("--download", action="store_true",
                   help="repo ids: fetch the repo's *.json and *.safetensors files into the Hugging Face cache "
                        "first (otherwise hf2q never downloads)")
    p.add_argument("--json", action="store_true",
                   help='print one JSON object on stdout (on failure: {"error": {...}})')


_DEVICE_HELP = ("where the weights go: auto (the first available of Metal on Apple, a CUDA GPU, the host) "
                "or a backend this build has")


def _add_family_options(p: argparse.ArgumentParser, what: str = "") -> None:
    """One flag per option the families declare (``--expert-dtype``,
    ``--dense-dtype``, ``--dtype``): the same choices for ``inspect`` (the
    plan a load would make) and ``load``; one the checkpoint's family does
    not take is a usage error."""
    for name, (opt, fams) in _cli_options().items():
        who = ", ".join(f.label for f in fams)
        p.add_argument(_flag(name), choices=list(opt.choices) if opt.choices is not None else None,
                       help=f"{who} only: {opt.help}{what} (default {opt.default})")


def build_parser() -> argparse.ArgumentParser:
    from . import _core
    from ._version import __version__

    devices = ["auto", *_core.backend_kinds()]  # the native backend registry
    parser = _Parser(
        prog="hf2q",
        description="HuggingFace safetensors checkpoints to inference-ready weights in device memory.",
        epilog="Environment: HF2Q_NUM_THREADS, HF2Q_NO_RESIDENCY, HF2Q_FORCE_SCALAR, HF2Q_NO_PROGRESS, "
               "HF2Q_HUGEPAGES, HF2Q_CUDA_STAGING_MIB, HF2Q_CUDA_SLOT_MIB, HF2Q_CACHE, HF2Q_CACHE_DIR, and "
               "Hugging Face's HF_HOME, HF_HUB_CACHE, HF_HUB_OFFLINE, HF_HUB_DISABLE_PROGRESS_BARS (see the README).",
    )
    parser.add_argument("--version", action="version", version=f"hf2q {__version__}",
                        help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    p = sub.add_parser("inspect", help="list a checkpoint's tensors, dtypes, shapes and bytes",
                       description="List a checkpoint's tensors, dtypes, shapes and bytes, and the device dtypes and "
                                   "resident bytes that `hf2q load` with the same options would give. Reads "
                                   "headers (and the config and tokenizer files) only.")
    _add_source(p, "any .safetensors file, index (.safetensors.index.json) or checkpoint folder, or a Hugging "
                   "Face repo id (owner/name) in the local cache")
    _add_family_options(p, ", as `hf2q load` would make them")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("load", help="validate a checkpoint and make it resident on a device",
                       description="Validate a checkpoint and make its weights resident on a device; print what "
                                   "was loaded. The family is read from the config.json of the checkpoint's "
                                   "folder: a DFlash drafter, Qwen3.5/3.6 MoE or Gemma 4 model, else any "
                                   "safetensors checkpoint under its own tensor names (generic).")
    _add_source(p, "a checkpoint folder, a .safetensors file or index (.safetensors.index.json), or a Hugging "
                   "Face repo id (owner/name) in the local cache")
    p.add_argument("--device", choices=devices, default="auto", help=_DEVICE_HELP)
    p.add_argument("--verify", action="store_true",
                   help="read every buffer back through the device and compare with a CPU decode")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar (bars are drawn only on a terminal anyway)")
    p.add_argument("--drafter", metavar="DRAFTER", help="a DFlash drafter (path or repo id) to load bound to this "
                   "target (its embedding and LM head become the target's buffers)")
    _add_family_options(p)
    p.set_defaults(func=cmd_load)

    p = sub.add_parser("demo", help="load a full-size synthetic DFlash drafter (written once to a cache folder)",
                       description="Write a full-size synthetic gemma-4-26B-A4B DFlash drafter (859 MB of random "
                                   "BF16 weights) once into a cache folder, then load and verify it.")
    p.add_argument("--device", choices=devices, default="auto", help=_DEVICE_HELP)
    p.add_argument("--cache-dir", metavar="DIR",
                   help="folder that keeps the synthetic checkpoint, in a sub-folder "
                        "(default $HF2Q_CACHE, else $XDG_CACHE_HOME/hf2q or ~/.cache/hf2q)")
    p.add_argument("--json", action="store_true",
                   help='print one JSON object on stdout (on failure: {"error": {...}})')
    p.add_argument("--no-verify", action="store_true", help="skip the read-back verification")
    p.add_argument("--remove", action="store_true", help="delete the demo's cached checkpoint and exit")
    p.add_argument("--config", help=argparse.SUPPRESS)  # another drafter config (tests: tiny); or HF2Q_DEMO_CONFIG
    p.set_defaults(func=cmd_demo)

    from .export.cli import add_parser as add_convert  # the convert subcommand lives with the GGUF writer

    add_convert(sub, _add_source)
    return parser


# =========================================================================== main


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    as_json = "--json" in argv
    try:
        args = parser.parse_args(argv)
    except UsageError as e:
        command = next((a for a in argv if not a.startswith("-")), None)
        return report_error(command if command in COMMANDS else None, e, as_json)
    if args.command is None:
        parser.print_help()
        return 0
    as_json = bool(getattr(args, "json", False))
    try:
        return int(args.func(args))
    except BrokenPipeError:  # `hf2q inspect ... | head`: the reader left; say nothing
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so that the exit-time flush does not fail again
        return 1
    except (Hf2qError, UsageError, OSError) as e:
        return report_error(args.command, e, as_json)
    except KeyboardInterrupt:
        print(f"hf2q {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
