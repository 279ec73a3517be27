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
from .errors import ConfigError, DeviceError, Hf2qError, SafetensorsError

DEFAULT_DEMO_CONFIG = "gemma-4-26B-A4B-it"
COMMANDS = ("inspect", "load", "demo", "convert", "cache")

# =========================================================================== naming a checkpoint


def resolve_source(args: argparse.Namespace) -> Path:
    """The local checkpoint that ``args.path`` names: a path, or a Hub repo
    id resolved through the local Hugging Face cache (``--revision``;
    ``--download`` to fetch). A missing path fails here, worded the same for
    every command."""
    from . import hub

    try:
        # A Hub page's URL is its repo id (and revision) from here on: the reports name those.
        args.path, args.revision, _ = hub.parse_url(args.path, args.revision)
        path = hub.resolve(args.path, args.revision, download=args.download, command=args.command)
    except ValueError as e:  # --revision/--download with a local path
        raise UsageError(str(e)) from None
    except hub.HubError as e:  # the fetch command: the user's, with --download
        _with_hint(e, fetch_hint(args, "download"))
        raise
    if not os.path.lexists(path):
        raise SafetensorsError(f"{path}: no such file or directory", code="Io", path=str(path))
    return path


def fetch_hint(args: argparse.Namespace, flag: str) -> str:
    """The command that fetches a repo id the user named: the command line
    they ran, every option kept (convert's ``--outtype``, ``--recipe``,
    ``--name`` and OUT: following the hint writes the file they asked for),
    with ``--<flag>`` added where it is not there: ``download`` (the
    checkpoint) or ``drafter-download`` (``load``'s drafter); before a
    ``--`` that ends the options; ``--json`` left out. Each part shell-quoted."""
    import shlex

    given = getattr(args, "argv", None)
    if given is None:  # arguments not parsed by main(): hf2q.hub's own hint stands
        return ""
    argv = [a for a in given if a != "--json"]  # (a person reads the hint: JSON or not is theirs to choose)
    want = f"--{flag}"
    at = argv.index("--") if "--" in argv else len(argv)  # the options end there
    if want not in argv[:at]:
        argv.insert(at, want)
    return " ".join(shlex.quote(str(x)) for x in ["hf2q", *argv])


def _with_hint(e: Exception, hint: str) -> None:
    """Replace the fetch command of ``e`` (a :class:`hf2q.hub.HubError`): its
    ``hint`` and the same words in its message become ``hint``. hf2q.hub
    knows only the repo id and revision, not the rest of the command line."""
    old = getattr(e, "hint", None)
    if hint and old and e.args and isinstance(e.args[0], str):
        msg = e.args[0]
        msg = msg[:-len(old)] + hint if msg.endswith(old) else msg.replace(old, hint)
        e.args = (msg, *e.args[1:])
        e.hint = hint  # type: ignore[attr-defined]  # --json's "hint"


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
    """The load summary (``LoadSummary.as_dict()`` plus ``verify``) for people:
    one ``label: value`` line each, the values in one column as wide as the
    longest label needs."""
    res = d["residency"]
    lines = [("model", d["model"]), ("device", d["device"]), ("device tensors", d["tensors"]),
             ("resident bytes", f"{d['resident_bytes']:,} ({format_bytes(d['resident_bytes'])})"),
             ("load time", f"{_seconds(d['seconds'])} ({d['gb_per_s']:.2f} GB/s of checkpoint data, "
                           f"{format_bytes(d['data_bytes'])})")]
    if d.get("cpu_seconds") is not None:  # what the time went on (a fresh process: mostly the kernel)
        spent = (f"CPU {_seconds(d['cpu_seconds'])} over all threads ({_seconds(d['system_seconds'])} in the "
                 f"kernel: file pages copied in, fresh memory faulted in, {d['page_faults']:,} page faults)")
        if d["seconds"] > d["cpu_seconds"]:  # no thread on a CPU for at least this long
            spent += f"; at least {_seconds(d['seconds'] - d['cpu_seconds'])} waiting (disk, other processes)"
        lines.append(("time spent", spent))
    if not res["enabled"]:
        state = "off (HF2Q_NO_RESIDENCY=1)" if os.environ.get("HF2Q_NO_RESIDENCY") == "1" else "off"
    else:
        state = (f"{res['buffers']} of the model's buffers in the residency set, "
                 f"{format_bytes(res['allocated_bytes'])} allocated, {format_bytes(res['locked_bytes'])} locked")
        if res["unwired_bytes"]:
            state += f", {format_bytes(res['unwired_bytes'])} over the wired budget"
    lines.append(("residency", state))
    for k, v in d.items():
        if k not in ("model", "device", "tensors", "resident_bytes", "data_bytes", "seconds", "gb_per_s",
                     "cpu_seconds", "system_seconds", "page_faults", "residency", "verify"):
            lines.append((k.replace("_", " "), v))
    if "verify" in d:
        v = d["verify"]
        lines.append(("verify", f"{v['buffers']} buffers read back through the device, "
                                f"{v['groups']:,} checksum groups equal ({_seconds(v['seconds'])})"))
    width = max(18, *(len(label) + 2 for label, _ in lines))  # label, colon, at least one space
    for label, value in lines:
        print(f"{label + ':':<{width}}{value}")


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
    gguf_names = plan.pop("gguf_names", None)  # families that plan GGUF tensors (Qwen3.5 MoE, Gemma 4)
    scales = plan.pop("scale_layouts", None)  # FP8 checkpoints: each weight's scale layout (docs/FP8.md)
    if "gpu_resident_bytes" in plan:  # the model API's name; the report says what it is
        plan["resident_bytes"] = plan.pop("gpu_resident_bytes")
    report.update(plan)
    for r in rows:
        if device_dtypes is not None:
            r["device_dtype"] = device_dtypes.get(r["name"])  # None: not loaded (skipped)
        if gguf_names is not None:
            r["gguf_names"] = gguf_names.get(r["name"], [])
        if scales is not None:
            r["scale"] = scales.get(r["name"])
    report["tensor_list"] = rows
    if args.json:
        emit_json(report)
        return 0
    name = f"{report['repo_id']}@{report['revision']} ({path})" if "repo_id" in report else str(path)
    print(f"{name}: {arch}, {_count(len(rows), 'tensor')} in {_count(len(files), 'file')}, {total:,} data bytes "
          f"({format_bytes(total)})")
    if "resident_bytes" in report:
        print(f"resident bytes: {report['resident_bytes']:,} ({format_bytes(report['resident_bytes'])})")
    if "quantization" in report:
        print(f"quantization: {report['quantization']}")
    width = max((len(r["name"]) for r in rows), default=4)
    dwidth = max((len(r["dtype"]) for r in rows), default=5)  # F8_E4M3 is wider than BF16
    dwidth = max(dwidth, 5)
    unloadable = set(report.get("unloadable", ()))
    for r in rows:
        line = f"  {r['name']:<{width}}  {r['dtype']:<{dwidth}} {str(tuple(r['shape'])):<22} {r['bytes']:>14,}"
        if "device_dtype" in r:  # the device dtype column, then the GGUF tensor(s) it goes into
            none = "unloadable" if r["name"] in unloadable else "skipped"
            line += f"  -> {r['device_dtype'] or none:<7}"
            if r.get("gguf_names"):
                line += " " + ", ".join(r["gguf_names"])
        if r.get("scale"):
            line += f"  [{r['scale']}]"
        print(line.rstrip())
    return 0


# =========================================================================== load


def open_device(kind: str | None) -> Any:
    """The device asked for, opened before any work (``metal`` where there
    is none fails here, with nothing written or read)."""
    from .device import Device

    if kind in (None, "auto"):
        return Device.default()
    try:
        return Device(kind)
    except DeviceError as e:
        if kind == "host":
            raise
        hint = "use --device host (the weights in this machine's memory) or --device auto (the first one available)"
        err = DeviceError(f"{e}; {hint}")
        err.hint = hint  # type: ignore[attr-defined]  # --json's "hint"
        raise err from None


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
    _refuse_dtypes_beside_recipe(given)
    return given


def _refuse_dtypes_beside_recipe(given: dict[str, Any]) -> None:
    """A dtype flag beside ``--recipe`` (which chooses every format) is a
    usage error naming the flags (hf2q.models.base refuses the keywords)."""
    from .recipes import replaced_by_recipe

    replaced = [_flag(k) for k in replaced_by_recipe(given)]
    if replaced:
        raise UsageError(f"--recipe {given['recipe']} chooses every tensor's format: it replaces "
                         f"{' and '.join(replaced)}; give one or the other")


def _load_model(path: Path, device: Any, progress: bool, args: argparse.Namespace) -> Any:
    from . import models

    _, config = models.read_config(path)
    fam = models.detect(config)
    return models.load_with(path, config, fam, device, progress=progress, check_finite=args.check_finite,
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
    if args.drafter_revision is not None or args.drafter_download:
        raise UsageError("--drafter-revision and --drafter-download apply to --drafter only")
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

    try:
        drafter = hub.resolve(args.drafter, args.drafter_revision, download=args.drafter_download,
                              command=args.command)
    except ValueError as e:  # --drafter-revision/--drafter-download with a local path
        raise UsageError(str(e).replace("--download", "--drafter-download")) from None
    except hub.HubError as e:  # the drafter's fetch command: --drafter-download, not the target's --download
        _with_hint(e, fetch_hint(args, "drafter-download"))
        raise
    if not os.path.lexists(drafter):
        raise SafetensorsError(f"{drafter}: no such file or directory", code="Io", path=str(drafter))
    _, config = models.read_config(path)
    fam = models.detect(config)
    pair = pairs.load_pair_with(path, config, fam, drafter, device, progress=not args.json and not args.no_progress,
                                check_finite=args.check_finite, **_options_for(fam, path, args))  # config.json read once, the target planned once
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
    given = f"--cache-dir {base}" if args.cache_dir else f"HF2Q_CACHE={base}" if os.environ.get("HF2Q_CACHE") else ""
    if given and os.path.lexists(base) and not base.is_dir():  # bad input, exit 2 (issues 11, 27)
        raise UsageError(f"{given}: not a directory (a file is there); choose a folder with --cache-dir DIR or "
                         "HF2Q_CACHE=DIR")
    name = "demo-gemma-4-26B-A4B-dflash" if config == DEFAULT_DEMO_CONFIG else f"demo-{config}-dflash"
    return base / name, config


def _remove_hint(args: argparse.Namespace) -> str:
    extra = f" --cache-dir {args.cache_dir}" if args.cache_dir else ""
    return f"hf2q demo --remove{extra}"


class Terminated(BaseException):
    """SIGTERM arrived while ``hf2q demo`` was writing its cache: raised so
    that the temporary folder is removed on the way out (exit 143)."""


def _terminate_as_exception() -> Any:
    """A context in which SIGTERM raises :class:`Terminated` (main thread
    only; the previous handler is put back after)."""
    import contextlib
    import signal
    import threading

    @contextlib.contextmanager
    def ctx() -> Any:
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def handler(signum: int, frame: Any) -> None:
            raise Terminated("terminated (SIGTERM)")

        old = signal.signal(signal.SIGTERM, handler)
        try:
            yield
        finally:
            signal.signal(signal.SIGTERM, old)

    return ctx()


def _demo_lock(target: Path, create: bool = True) -> Any:
    """An exclusive ``flock`` on the cache folder that holds the demo's
    folder (a directory can be locked; no lock file is left behind): demos
    writing into the same cache folder, and ``--remove``, run one after the
    other. Released when the process ends, however it ends. (Not POSIX: no
    lock.)"""
    import contextlib

    @contextlib.contextmanager
    def ctx() -> Any:
        try:
            import fcntl
        except ImportError:  # pragma: no cover - not POSIX
            yield
            return
        if not create and not target.parent.is_dir():  # --remove with no cache folder: nothing to guard
            yield
            return
        target.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(str(target.parent), os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    return ctx()


def _remove_stale_temporaries(target: Path) -> list[str]:
    """Remove ``<target>.tmp*`` folders (under the lock no other run writes
    one); their names."""
    if not target.parent.is_dir():
        return []
    gone = []
    for stale in sorted(target.parent.glob(target.name + ".tmp*")):
        if stale.is_symlink() or not stale.is_dir():
            stale.unlink()
        else:
            shutil.rmtree(stale)
        gone.append(str(stale))
    return gone


def _count(n: int, noun: str) -> str:
    """``n`` and ``noun``, plural unless one: "1 tensor", "25 tensors"."""
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def _remove_demo(target: Path) -> dict[str, Any]:
    """``hf2q demo --remove``: what was there and what was done, in words
    (``did``) and fields. A symbolic link is removed, never followed (what it
    points to is not the demo's to delete); a failure to remove raises."""
    temporaries = _remove_stale_temporaries(target)
    existed = os.path.lexists(target)
    # "removed": whether something was (a consumer of --json read the path there as done)
    report: dict[str, Any] = {"path": str(target), "removed": existed, "existed": existed, "symlink": False,
                              "temporaries_removed": temporaries}
    if os.path.islink(target):
        dest = os.readlink(target)
        os.unlink(target)
        report.update(symlink=True, link_target=dest)
        did = f"removed the symbolic link {target} (it pointed to {dest}, which was left as it is)"
    elif os.path.isdir(target):
        shutil.rmtree(target)
        did = f"removed {target}"
    elif os.path.lexists(target):
        os.unlink(target)
        did = f"removed {target} (a file, not the demo's folder)"
    else:
        did = f"nothing to remove: {target} does not exist"
    if temporaries:
        did += f"; removed {len(temporaries)} temporary folder(s) of an interrupted run"
    report["did"] = did
    return report


def _fsync_path(path: Path) -> None:
    fd = os.open(str(path), os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) if path.is_dir() else os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_synced(path: Path, data: bytes) -> None:
    fd = os.open(str(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def _sync_tree(folder: Path) -> None:
    """fsync every file under ``folder``, then each folder (deepest first)."""
    dirs = []
    for root, subdirs, files in os.walk(folder):
        dirs.append(Path(root))
        for f in files:
            _fsync_path(Path(root) / f)
    for d in reversed(dirs):
        _fsync_path(d)


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
        with _demo_lock(target, create=False):
            report = _remove_demo(target)
        if args.json:
            emit_json(report)
        else:
            note(args, report["did"])
        return 0
    device = open_device(args.device)  # before writing anything
    from . import dflash
    from .dflash import DFlashConfig, expected_total_data_bytes

    # With --json the lines for people wait until the demo succeeded: a
    # failure prints its error object and nothing on stderr.
    held: list[str] = []
    say = held.append if args.json else (lambda text: note(args, text))
    size = format_bytes(expected_total_data_bytes(DFlashConfig.from_dict(dflash.DRAFTER_CONFIGS[config])))
    try:  # the cache folder the user chose (or the default) must be writable: say so by its name
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DemoCacheError(target.parent, e, args) from e
    with _demo_lock(target):  # one writer at a time; a second run waits, then finds it cached
        stale = _remove_stale_temporaries(target)  # left by a run that was killed (SIGKILL, power loss)
        if stale:
            say(f"removed {len(stale)} temporary folder(s) left by an interrupted run: {', '.join(stale)}")
        if (target / ".complete").is_file():
            say(f"using the cached synthetic drafter ({size}) in {target}; remove it with: {_remove_hint(args)}")
        else:
            from . import testing

            what = (f"the full-size synthetic gemma-4-26B-A4B DFlash drafter ({size})"
                    if config == DEFAULT_DEMO_CONFIG else f"the synthetic {config} DFlash drafter ({size})")
            say(f"writing {what} to {target} (once)")
            tmp = target.with_name(target.name + f".tmp{os.getpid()}")
            try:
                with _terminate_as_exception():
                    testing.make_dflash_checkpoint(tmp, None if config == DEFAULT_DEMO_CONFIG else config,
                                                   progress=not args.json)
                    _sync_tree(tmp)  # the data is on disk before anything says it is complete
                    _write_synced(tmp / ".complete", b"ok\n")
                    _fsync_path(tmp)
                    if os.path.islink(target) or os.path.isfile(target):
                        os.unlink(target)
                    else:
                        shutil.rmtree(target, ignore_errors=True)  # an incomplete earlier copy
                    os.replace(tmp, target)
                    _fsync_path(target.parent)  # the rename itself
            except OSError as e:
                shutil.rmtree(tmp, ignore_errors=True)
                raise DemoCacheError(target.parent, e, args) from e
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            say(f"cached in {target}; remove it with: {_remove_hint(args)}")
    model = dflash.load(target, device=device, progress=not args.json)
    d = load_report(model, not args.no_verify, checkpoint=str(target))
    for text in held:
        note(args, text)
    if args.json:
        emit_json(d)
    else:
        print_summary(d)
    return 0


class DemoCacheError(OSError):
    """The demo's cache folder cannot be written: the system's failure (exit
    status 1), named by the folder the user chose (``--cache-dir``,
    ``HF2Q_CACHE`` or the default), not by the temporary folder inside it,
    with a hint to choose another."""

    def __init__(self, cache: Path, cause: OSError, args: argparse.Namespace) -> None:
        why = cause.strerror or str(cause)
        blocker = next((p for p in (cache, *cache.parents) if os.path.lexists(p)), None)
        if blocker is not None and blocker != cache and not blocker.is_dir():
            why = f"{why} ({blocker} is a file, not a folder)"
        source = ("--cache-dir" if args.cache_dir else
                  "HF2Q_CACHE" if os.environ.get("HF2Q_CACHE") else "the default cache folder")
        self.hint = "choose a folder that can be written with --cache-dir DIR or HF2Q_CACHE=DIR"
        self.path = str(cache)  # --json's "path"; the message names it already
        super().__init__(cause.errno, f"cannot write the demo checkpoint in {cache} ({source}): {why}; {self.hint}")


# =========================================================================== convert (GGUF: hf2q.export)


#: The family options that ``--outtype`` sets when not given (hf2q.export's planner).
_CONVERT_BY_OUTTYPE = ("expert_dtype", "dense_dtype")
#: What ``convert``'s help calls a family's checkpoints where its label says more than convert writes.
_CONVERT_LABELS = {"generic": "Llama, Mistral, Qwen3, Qwen3-MoE"}


def _convert_options() -> dict[str, Any]:
    """The family options ``convert`` offers, as each family declares them
    (:class:`hf2q.models.base.Option`; ``mtp`` as ``--no-mtp``) and as far as
    hf2q.export's writer of that family takes them: loader keyword ->
    (option, the families whose conversion takes it), in registry order."""
    from . import models
    from .export import _FAMILIES  # family -> (..., the options its conversion takes)

    out: dict[str, Any] = {}
    for fam in models.FAMILIES:
        row = _FAMILIES.get(fam.name)
        if row is None:  # a family hf2q convert writes no GGUF file for (DFlash drafters)
            continue
        impl = fam.impl()
        for o in impl.options:
            if o.name in row[3] and (o.cli or o.name == "mtp"):
                out.setdefault(o.name, (o, []))[1].append(impl)
    return out


def _add_convert_parser(sub: Any) -> None:
    """Register ``convert`` (the GGUF writer, hf2q.export) on the subparsers."""
    from .export import OUTTYPES

    p = sub.add_parser(
        "convert", help="write the GGUF file llama.cpp's convert_hf_to_gguf.py writes (Qwen3.5/3.6 MoE, Gemma 4, "
                        "Llama, Mistral, Qwen3, Qwen3-MoE)",
        description="Write the GGUF file that llama.cpp's convert_hf_to_gguf.py --outtype OUTTYPE writes for "
                    "the checkpoint: the same tensors, types, shapes, bytes and order, the same "
                    "hyper-parameter keys; with --recipe, the file llama-quantize writes from the converter's "
                    "BF16 file. The file is streamed (bounded memory), written under a temporary "
                    "name in OUT's folder and renamed when complete.")
    _add_source(p, "a checkpoint folder, a .safetensors file or index, or a Hugging Face repo id in the local cache")
    p.add_argument("out", metavar="OUT.gguf", help="the GGUF file to write")
    p.add_argument("--outtype", choices=list(OUTTYPES), default="q8_0",
                   help="as for llama.cpp's converter: the type of the weight matrices (norms, routers and 1-D "
                        "tensors stay F32); default q8_0")
    from .export import _FAMILIES

    opts = _convert_options()
    for name, (opt, fams) in opts.items():
        # What convert writes of each family (the generic family: its llama-like architectures).
        labels = [_CONVERT_LABELS.get(f.name, f.label) for f in fams]
        who = "every family" if len(fams) == len(_FAMILIES) else ", ".join(labels) + " only"
        if name == "mtp":  # a Python-only bool (mtp=False): the converter's --no-mtp
            p.add_argument("--no-mtp", dest="mtp", action="store_const", const=False,
                           help=f"{who}: leave the multi-token-prediction block out (the converter's --no-mtp)")
            continue
        default = "--outtype" if name in _CONVERT_BY_OUTTYPE else ("none" if opt.default is None else opt.default)
        also = " and --outtype" if name == "recipe" else ""
        p.add_argument(_flag(name), choices=list(opt.choices) if opt.choices is not None else None,
                       help=f"{who}: {opt.help}{also} (default {default})")
    p.add_argument("--name", help="general.name (default: the checkpoint folder's name, as the converter does)")
    p.add_argument("--force", action="store_true", help="replace OUT.gguf if it exists")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (drawn only on a terminal anyway)")
    p.set_defaults(func=cmd_convert)


def cmd_convert(args: argparse.Namespace) -> int:
    from .export import convert

    path = resolve_source(args)
    options = {k: getattr(args, k) for k in _convert_options() if getattr(args, k, None) is not None}
    _refuse_dtypes_beside_recipe(options)
    try:
        summary = convert(path, args.out, args.outtype, force=args.force,
                          progress=not (args.no_progress or args.json), name=args.name or _convert_default_name(args),
                          **options)
    except TypeError as e:  # an option this family does not take
        raise UsageError(str(e)) from None
    d = summary.as_dict()
    if args.json:
        emit_json(d)
    else:
        what = f"recipe {d['recipe']}" if d.get("recipe") else d["outtype"]
        print(f"{d['output']}: {d['architecture']} ({what}), {d['tensors']} tensors, "
              f"{format_bytes(d['bytes'])} in {d['seconds']:.2f} s ({d['gb_per_s']:.2f} GB/s); "
              f"tokenizer: {d['tokenizer']}", file=sys.stdout)
    return 0


def _convert_default_name(args: argparse.Namespace) -> str | None:
    """A repo id names the model as the converter names a remote one: the id."""
    p = args.path
    return p if not os.path.exists(p) and "/" in p and not p.startswith((".", "/")) else None


# =========================================================================== version, cache

#: Packages whose versions ``hf2q --version --verbose`` reports (read from their
#: installed metadata, none imported): the dependencies, then the optional ones.
_DEPENDENCIES = ("numpy", "ml_dtypes", "safetensors", "tqdm", "huggingface_hub")
_OPTIONAL = ("torch", "transformers", "gguf", "nvidia-cuda-nvrtc")


def _package_version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def version_report() -> dict[str, Any]:
    """What ``hf2q --version --verbose`` prints: the build, the kernels'
    instruction set, each backend this build has and whether it opens here
    (with the reason when not), the dependencies' versions and the caches."""
    import platform

    from . import _core, _cuda
    from ._version import __version__
    from .device import Device

    backends: dict[str, str] = {}
    for kind in _core.backend_kinds():
        try:
            Device(kind)
            backends[kind] = "available"
        except (DeviceError, OSError) as e:
            backends[kind] = f"unavailable: {e}"
    forced = not _core.simd_enabled()
    return {
        "version": __version__,
        "python": f"{platform.python_implementation()} {platform.python_version()} ({sys.executable})",
        "platform": f"{platform.system()} {platform.machine()}",
        "native_core": str(getattr(_core, "__file__", "")),
        "simd": {"in_use": _core.simd_isa(), "best": _core.best_isa(),
                 "forced_scalar": forced},  # HF2Q_FORCE_SCALAR=1
        "threads": int(_core.get_num_threads()),
        "backends": backends,
        "dependencies": {n: _package_version(n) for n in _DEPENDENCIES},
        "optional": {n: _package_version(n) for n in _OPTIONAL},
        "caches": {"demo": str(demo_cache_dir()), "cuda_kernels": _cuda.cache_dir() or None},
    }


def print_version(verbose: bool, as_json: bool) -> int:
    from ._version import __version__

    if not verbose:
        print(json.dumps({"version": __version__}) if as_json else f"hf2q {__version__}")
        return 0
    r = version_report()
    if as_json:
        emit_json(r)
        return 0
    simd = r["simd"]
    lines = [
        ("python", r["python"]), ("platform", r["platform"]), ("native core", r["native_core"]),
        ("SIMD", f"{simd['in_use']} (best on this CPU: {simd['best']}"
                 + ("; scalar forced by HF2Q_FORCE_SCALAR=1)" if simd["forced_scalar"] else ")")),
        ("threads", r["threads"]),
        *((f"backend {k}", v) for k, v in r["backends"].items()),
        ("dependencies", ", ".join(f"{k} {v or 'missing'}" for k, v in r["dependencies"].items())),
        ("optional", ", ".join(f"{k} {v or '-'}" for k, v in r["optional"].items())),
        ("demo cache", r["caches"]["demo"]),
        ("CUDA kernel cache", r["caches"]["cuda_kernels"] or "off (HF2Q_CACHE_DIR is empty)"),
    ]
    print(f"hf2q {r['version']}")
    width = max(len(label) for label, _ in lines) + 2
    for label, value in lines:
        print(f"{label + ':':<{width}}{value}")
    return 0


def _tree_bytes(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


def cache_entries() -> list[tuple[str, Path]]:
    """What hf2q itself keeps on disk: the demo's checkpoints
    (``<demo cache>/demo-*-dflash``, with interrupted ``.tmp*`` copies) and
    the CUDA kernel cache (``$HF2Q_CACHE_DIR/cuda``). Nothing else in those
    folders is hf2q's."""
    from . import _cuda

    out: list[tuple[str, Path]] = []
    demo = demo_cache_dir()
    if demo.is_dir():
        out += [("demo checkpoint", p) for p in sorted(demo.glob("demo-*-dflash*")) if p.is_dir()]
    cuda = _cuda.cache_dir()
    if cuda and os.path.isdir(cuda):
        out.append(("CUDA kernels", Path(cuda)))
    return out


def cmd_cache(args: argparse.Namespace) -> int:
    """``hf2q cache``: list what hf2q keeps on disk; ``--clear`` removes it."""
    entries = [(what, path, _tree_bytes(path)) for what, path in cache_entries()]
    if args.clear:
        for _, path, _ in entries:
            shutil.rmtree(path)
    rows = [{"what": what, "path": str(path), "bytes": n} for what, path, n in entries]
    if args.json:
        emit_json({"entries": rows, "cleared": bool(args.clear)})
        return 0
    if not rows:
        print("nothing cached")
    for r in rows:
        verb = "removed " if args.clear else ""
        print(f"{verb}{r['what']}: {r['path']} ({format_bytes(r['bytes'])})")
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
    err: dict[str, Any] = {"type": type(e).__name__, "message": str(e) or ("out of memory" if isinstance(
        e, MemoryError) else type(e).__name__)}
    if isinstance(e, OSError) and not isinstance(e, Hf2qError):  # the system's error: say which file
        err["message"] = str(e.strerror or e)
        if e.filename:
            err["path"] = str(e.filename)
    for attr in ("code", "path", "tensor", "key", "repo_id", "revision", "hint"):
        v = getattr(e, attr, None)
        if isinstance(v, (str, int)) and not isinstance(v, bool) and attr not in err:
            err[attr] = v
    if exit_code(e) == 1:  # the machine's own failure, not the input: may work elsewhere or later
        err["system_failure"] = True
    problems = getattr(e, "problems", None)
    if problems:
        err["problems"] = [{"kind": p.kind, "tensor": p.tensor, "expected": p.expected, "actual": p.actual}
                           for p in problems]
    return {"error": err}


def exit_code(e: BaseException) -> int:
    """The one rule (README, docs/RELIABILITY.md): 2 for bad input or a wrong
    command line (a :class:`UsageError`, an :class:`Hf2qError` that is not a
    ``system_failure``); 1 for the machine's own failure (out of memory, out
    of file descriptors, a full disk, an I/O error, a device that cannot be
    opened, a download that failed on the network or the server, any other
    ``OSError``)."""
    if isinstance(e, UsageError):
        return 2
    if isinstance(e, Hf2qError):
        return 1 if e.system_failure else 2
    return 1


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
    elif isinstance(e, MemoryError):
        print(f"hf2q {command}: error: out of memory{': ' + str(e) if str(e) else ''}", file=sys.stderr)
    else:
        print(f"hf2q {command}: error: {e}", file=sys.stderr)
    return exit_code(e)


# =========================================================================== parser


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors raised (so that ``--json`` can report them as JSON)."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message, self.format_usage())

    def _print_message(self, message: str, file: Any = None) -> None:
        # argparse's own swallows OSError: `hf2q --version | (exec <&-)` would exit 0 having printed
        # nothing; here a broken pipe reaches main(), which exits 141 like every other command.
        file = file or sys.stderr
        if message and file is not None:
            file.write(message)


def _add_source(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("path", metavar="PATH_OR_REPO", help=what)
    p.add_argument("--revision", metavar="REV",
                   help="repo ids: branch, tag or commit hash in the Hugging Face cache (default: main)")
    from .hub import DOWNLOAD_PATTERNS  # what --download fetches: said from the list the code uses

    fetched = ", ".join(DOWNLOAD_PATTERNS[:-1]) + " and " + DOWNLOAD_PATTERNS[-1]
    p.add_argument("--download", action="store_true",
                   help=f"repo ids: fetch the repo's {fetched} files into the Hugging Face cache "
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
                       help=f"{who} only: {opt.help}{what} (default {'none' if opt.default is None else opt.default})")


def build_parser() -> argparse.ArgumentParser:
    from . import _core
    from ._version import __version__

    devices = ["auto", *_core.backend_kinds()]  # the native backend registry
    parser = _Parser(
        prog="hf2q",
        description="HuggingFace safetensors checkpoints to inference-ready weights in device memory.",
        epilog="Environment: HF2Q_NUM_THREADS, HF2Q_NO_RESIDENCY, HF2Q_FORCE_SCALAR, HF2Q_NO_PROGRESS, "
               "HF2Q_HUGEPAGES, HF2Q_CUDA_STAGING_MIB, HF2Q_CUDA_SLOT_MIB, HF2Q_CUDA_TRACE, HF2Q_CACHE, "
               "HF2Q_CACHE_DIR, and Hugging Face's HF_HOME, HF_HUB_CACHE, HF_HUB_OFFLINE, HF_HUB_DISABLE_PROGRESS_BARS (see the README).",
    )
    parser.add_argument("--version", action="store_true",
                        help=f"print the version ({__version__}) and exit; with --verbose also the SIMD path, the "
                             "backends and whether each opens here, the dependencies' versions and the caches")
    parser.add_argument("--verbose", action="store_true", help="with --version: the details")
    parser.add_argument("--json", action="store_true", help="with --version: as one JSON object")
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
    p.add_argument("--check-finite", action="store_true",
                   help="refuse a NaN/Inf weight that would be kept as it is (copied or decoded), naming the tensor "
                        "and element (quantized tensors refuse them always); off by default: the bytes are the "
                        "file's")
    p.add_argument("--drafter", metavar="DRAFTER", help="a DFlash drafter (path or repo id) to load bound to this "
                   "target (its embedding and LM head become the target's buffers)")
    p.add_argument("--drafter-revision", metavar="REV",
                   help="a drafter repo id: branch, tag or commit hash (default: main; --revision is the target's)")
    p.add_argument("--drafter-download", action="store_true",
                   help="a drafter repo id: fetch it into the Hugging Face cache first (--download is the target's)")
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

    _add_convert_parser(sub)

    p = sub.add_parser("cache", help="list (or --clear) what hf2q keeps on disk: demo checkpoints, CUDA kernels",
                       description="List what hf2q keeps on disk, with sizes: the demo's synthetic checkpoints "
                                   "(in $HF2Q_CACHE, else $XDG_CACHE_HOME/hf2q or ~/.cache/hf2q) and the compiled "
                                   "CUDA kernels (in $HF2Q_CACHE_DIR/cuda, same default root). Nothing else in "
                                   "those folders is touched.")
    p.add_argument("--clear", action="store_true", help="remove them")
    p.add_argument("--json", action="store_true",
                   help='print one JSON object on stdout (on failure: {"error": {...}})')
    p.set_defaults(func=cmd_cache)
    return parser


# =========================================================================== main


#: Exit status when stdout's reader went away (``hf2q inspect ... | head``):
#: 128 + SIGPIPE, what a shell reports for a program SIGPIPE ended.
EXIT_BROKEN_PIPE = 128 + 13
#: Exit status when interrupted (SIGINT): 128 + SIGINT.
EXIT_INTERRUPTED = 128 + 2
#: Exit status when ``demo`` is ended by SIGTERM while writing: 128 + SIGTERM.
EXIT_TERMINATED = 128 + 15


def _path_safe(exc: UnicodeEncodeError) -> tuple[bytes | str, int]:
    """Encoding error handler of the CLI's stdout: a file name with bytes
    that are not UTF-8 (held as ``surrogateescape`` surrogates) is written
    back as those bytes; any other character the stream cannot encode as a
    backslash escape. So any path prints, on any locale."""
    out = bytearray()
    for ch in exc.object[exc.start:exc.end]:
        o = ord(ch)
        if 0xDC80 <= o <= 0xDCFF:
            out.append(o - 0xDC00)
        else:
            out += ch.encode("ascii", "backslashreplace")
    return bytes(out), exc.end


_HANDLER = "hf2q.path_safe"


class _Streams:
    """stdout with :func:`_path_safe` for the duration of ``main`` (the
    caller's stream settings are put back after)."""

    def __enter__(self) -> _Streams:
        import codecs

        try:
            codecs.lookup_error(_HANDLER)
        except LookupError:
            codecs.register_error(_HANDLER, _path_safe)
        self.old: str | None = None
        out = sys.stdout
        if out is not None and hasattr(out, "reconfigure"):
            try:
                self.old = out.errors
                out.reconfigure(errors=_HANDLER)
            except (AttributeError, ValueError, OSError):
                self.old = None
        return self

    def __exit__(self, *exc: object) -> None:
        out = sys.stdout
        if self.old is not None and out is not None:
            try:
                out.reconfigure(errors=self.old)
            except (AttributeError, ValueError, OSError):
                pass


def _stdout_gone() -> int:
    """stdout's reader left: point fd 1 at /dev/null so that what is still
    buffered, flushed at interpreter exit, goes nowhere instead of raising
    there ("Exception ignored ... BrokenPipeError"); say nothing."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (AttributeError, ValueError, OSError):  # not a real file (a test's capture): nothing to redirect
        pass
    return EXIT_BROKEN_PIPE


def _broken_pipe(e: BaseException) -> bool:
    import errno

    return isinstance(e, BrokenPipeError) or (isinstance(e, OSError) and e.errno == errno.EPIPE)


class _NoStdout:
    """sys.stdout while there is none (``hf2q inspect X >&-``: fd 1 closed,
    Python's sys.stdout is None): takes what the command prints and
    remembers that it had output it could not write."""

    written = False

    def write(self, text: str) -> int:
        self.written = self.written or bool(text)
        return len(text)

    def flush(self) -> None:
        pass


#: Exit status when the command's output could not be written (stdout closed):
#: what GNU tools give for a write error.
EXIT_WRITE_ERROR = 1


def main(argv: Sequence[str] | None = None) -> int:
    """The ``hf2q`` command. Returns the exit status (see the README): 0, 2
    for bad input, 1 for the machine's own failure or when stdout is closed
    and the command had output (``>&-``), 130 when interrupted, 141 when
    stdout's reader went away (nothing printed then)."""
    if sys.stdout is not None:
        return _main_streams(argv)
    sink = _NoStdout()
    sys.stdout = sink  # type: ignore[assignment]
    try:
        try:
            code = _main_streams(argv)
        except SystemExit as e:  # argparse's --help / --version
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    finally:
        sys.stdout = None  # type: ignore[assignment]
    if not sink.written:
        return code
    command = next((a for a in (sys.argv[1:] if argv is None else argv) if a in COMMANDS), None)
    if sys.stderr is not None:
        print(f"hf2q{' ' + command if command else ''}: error: standard output is closed: the output could not be "
              "written", file=sys.stderr)
    return code or EXIT_WRITE_ERROR


def _main_streams(argv: Sequence[str] | None) -> int:
    with _Streams():
        try:
            try:
                code = _main(argv)
            except SystemExit:  # argparse's --version/--help: printed, then exit
                _flush_stdout()
                raise
            _flush_stdout()  # here, where a failure can be handled, not at interpreter exit
            return code
        except OSError as e:
            if not _broken_pipe(e):
                raise
            return _stdout_gone()


def _flush_stdout() -> None:
    if sys.stdout is not None:
        sys.stdout.flush()


def _interrupted(command: str | None, as_json: bool, what: str = "interrupted", status: int = 0) -> int:
    """SIGINT (SIGTERM while ``demo`` writes): under ``--json`` still the one
    error object on stdout (and nothing on stderr), else one line on stderr;
    status 130 (143)."""
    if as_json:
        kind = "KeyboardInterrupt" if what == "interrupted" else "Terminated"
        emit_json({"error": {"type": kind, "message": what}})
    else:
        print(f"hf2q{' ' + command if command else ''}: {what}", file=sys.stderr)
    return status or EXIT_INTERRUPTED


def _command_parser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    """The sub-parser of ``command`` (one of :data:`COMMANDS`)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices[command]
    raise KeyError(command)  # pragma: no cover - build_parser always adds them


def _main(argv: Sequence[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    as_json = "--json" in argv
    command = next((a for a in argv if a in COMMANDS), None)
    try:
        parser = build_parser()
        try:
            args = parser.parse_args(argv)
            args.argv = argv  # the command line as given (fetch_hint repeats it)
        except UsageError as e:
            command = next((a for a in argv if not a.startswith("-")), None)
            command = command if command in COMMANDS else None
            if command is not None and str(e).startswith("unrecognized arguments"):
                # (argparse's top-level parser finds the leftovers: show the command's own usage)
                e.usage = _command_parser(parser, command).format_usage()
            return report_error(command, e, as_json)
        if args.command is None and not args.version:  # argparse's convention: usage on stderr, status 2
            if getattr(args, "verbose", False):
                return report_error(None, UsageError("--verbose goes with --version (hf2q --version --verbose), "
                                                     "or a command is required (inspect, load, demo, convert, "
                                                     "cache)", parser.format_usage()), as_json)
            return report_error(None, UsageError("a command is required (inspect, load, demo, convert, cache); "
                                                 "hf2q --help lists them", parser.format_usage()), as_json)
        command = args.command
        as_json = bool(getattr(args, "json", False))
        try:
            if args.version:
                return print_version(args.verbose, as_json)
            return int(args.func(args))
        except (Hf2qError, UsageError, OSError, MemoryError) as e:
            if _broken_pipe(e) and not isinstance(e, Hf2qError):
                raise  # stdout went away: main() handles it
            return report_error(args.command, e, as_json)
    except KeyboardInterrupt:
        return _interrupted(command, as_json)
    except Terminated:
        return _interrupted(command, as_json, "terminated", EXIT_TERMINATED)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
