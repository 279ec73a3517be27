"""Hand a checkpoint to transformers with hf2q's resident weights: no second
copy (docs/HANDOFF.md).

:func:`from_pretrained` builds transformers' own model class for the
checkpoint's config on the meta device, exactly as transformers'
``from_pretrained`` does, asks transformers for the conversions it applies to
such a checkpoint (``conversion_mapping.get_model_conversion_mapping``:
renames, prefix changes of multimodal wrappers, per-expert tensors stacked
into fused parameters), turns them into an hf2q load plan (each source's
bytes read straight to its place in the stacked buffer, see
:mod:`hf2q._handoff`), loads it, and assigns the buffers' DLPack views as the
model's parameters (``load_state_dict(assign=True)``). What transformers does
after loading (tied weights, non-persistent buffers such as RoPE tables) is
done by transformers' own finishing step. The result is in eval mode.

One of the two places hf2q imports torch (with :mod:`hf2q.torch`); it also
imports transformers. Tested with transformers 5.24.0 (see
:data:`TESTED_TRANSFORMERS`); an older major version, or one whose loading
internals moved, is refused with :class:`HandoffError` naming what is missing.
"""

from __future__ import annotations

import copy
import itertools
import os
import traceback
from pathlib import Path
from typing import Any, Union

import torch
import transformers

from ._handoff import HandoffError, Target, plan_handoff
from .device import _detached, close_device, resolve_device
from .torch import _state_dict
from .model import LoadedModel

__all__ = ["from_pretrained", "HandoffError", "TESTED_TRANSFORMERS", "MIN_TRANSFORMERS"]

PathLike = Union[str, "os.PathLike[str]"]

#: The transformers releases the hand-off tests ran against: the test extra's
#: pin (CI, CPU) and the GPU machine's image (tests/test_handoff.py -m cuda).
TESTED_TRANSFORMERS = ("5.17.0", "5.24.0")
#: The oldest major.minor with the weight-conversion mapping this module reads.
MIN_TRANSFORMERS = (5, 0)

#: ``dtype`` argument -> torch dtype (``keep``: what transformers' own
#: ``dtype="auto"`` picks, the config's ``dtype``).
_DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
#: torch dtype -> hf2q device format.
_FORMATS = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16", torch.int32: "i32",
            torch.uint8: "u8"}


class HandoffModel(LoadedModel):
    """The hf2q buffers behind a handed-off transformers model, under
    transformers' parameter names."""

    family = "transformers"


def _version() -> tuple[int, ...]:
    out: list[int] = []
    for part in transformers.__version__.split(".")[:2]:
        digits = "".join(ch for ch in part if ch.isdigit())
        out.append(int(digits or 0))
    return tuple(out)


def _internals() -> dict[str, Any]:
    """The transformers loading pieces the hand-off uses, or a HandoffError
    naming the first one this transformers lacks."""
    if _version() < MIN_TRANSFORMERS:
        raise HandoffError(
            f"hf2q.transformers needs transformers >= {'.'.join(map(str, MIN_TRANSFORMERS))} (its weight "
            f"conversion mapping); this is transformers {transformers.__version__} (tested: "
            f"{', '.join(TESTED_TRANSFORMERS)})", missing=[f"transformers>={'.'.join(map(str, MIN_TRANSFORMERS))}"])
    wanted = {
        "get_model_conversion_mapping": "transformers.conversion_mapping",
        "WeightConverter": "transformers.core_model_loading",
        "WeightRenaming": "transformers.core_model_loading",
        "MergeModulelist": "transformers.core_model_loading",
        "Concatenate": "transformers.core_model_loading",
        "rename_source_key": "transformers.core_model_loading",
        "dot_natural_key": "transformers.core_model_loading",
        "build_glob_alternation": "transformers.core_model_loading",
        "LoadStateDictConfig": "transformers.modeling_utils",
        "LoadStateDictInfo": "transformers.utils.loading_report",
        "ContextManagers": "transformers.utils.generic",
    }
    import importlib

    out: dict[str, Any] = {}
    for name, module in wanted.items():
        try:
            out[name] = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            raise HandoffError(f"transformers {transformers.__version__} has no {module}.{name}, which the "
                               f"hand-off uses (tested: {', '.join(TESTED_TRANSFORMERS)})",
                               missing=[f"{module}.{name}"]) from None
    for attr in ("_finalize_model_loading", "_get_dtype_plan", "get_init_context", "get_parameter_or_buffer"):
        if not hasattr(transformers.PreTrainedModel, attr):
            raise HandoffError(f"transformers {transformers.__version__} has no PreTrainedModel.{attr}, which the "
                               f"hand-off uses (tested: {', '.join(TESTED_TRANSFORMERS)})",
                               missing=[f"PreTrainedModel.{attr}"])
    return out


def _model_class(config: Any) -> type:
    """transformers' class for the config: ``architectures[0]``, else the
    causal-LM class registered for the config's type."""
    archs = getattr(config, "architectures", None) or []
    if archs:
        cls = getattr(transformers, archs[0], None)
        if cls is None:
            raise HandoffError(f"transformers {transformers.__version__} has no model class {archs[0]!r} "
                               "(config.json 'architectures')", missing=[archs[0]])
        return cls
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    try:
        return MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
    except KeyError:
        raise HandoffError(f"transformers {transformers.__version__} has no causal-LM class for model_type "
                           f"{getattr(config, 'model_type', None)!r}", missing=[str(config.model_type)]) from None


def _torch_dtype(dtype: str, config: Any) -> torch.dtype:
    if dtype in _DTYPES:
        return _DTYPES[dtype]
    if dtype != "keep":
        raise ValueError(f"dtype must be one of keep, bf16, f16, f32, got {dtype!r}")
    for cfg in (config, getattr(config, "get_text_config", lambda: None)()):
        d = getattr(cfg, "dtype", None) if cfg is not None else None
        if isinstance(d, str):
            d = getattr(torch, d, None)
        if isinstance(d, torch.dtype) and d.is_floating_point:
            return d
    return torch.float32  # transformers' default without a config dtype


def _hf2q_device(device: Any) -> Any:
    from .device import Device

    if device is None:
        return Device.default()
    if isinstance(device, Device):
        return device
    return Device(_device_kind(device))


def _device_kind(device: Any) -> str:
    """The hf2q device kind a torch-style name means (``"cpu"``: the host)."""
    name = str(device)
    return "host" if name == "cpu" else name


def _opening(device: Any) -> Any:
    """``_hf2q_device(device)`` begun on a helper thread
    (:func:`hf2q.device.open_meanwhile`), so that opening a device this
    process has not opened yet (on CUDA a driver context and NVRTC's
    kernels: 0.11 s on the H200 machine, the GIL released) overlaps
    transformers building the model and its conversion mapping (Python). A
    device string is parsed first, here, so that a bad one is refused at
    once (a device that cannot be opened is reported once the model is built
    and the load planned, and not at all when those fail first). A
    :class:`hf2q.Device` is used as it is."""
    from .device import Device, _device_spec, open_meanwhile

    if isinstance(device, Device):
        return device
    kind = None if device is None else _device_kind(device)
    if kind is not None:
        _device_spec(kind)  # ValueError now, not later
    return open_meanwhile(kind, lambda: _hf2q_device(device))


def _build(cls: type, config: Any, dtype: torch.dtype, tf: dict[str, Any]) -> Any:
    """The model on the meta device, in the contexts transformers' own
    ``from_pretrained`` builds it in (dtype, no tying yet, meta device)."""
    try:
        try:  # (dtype, is_quantized, _is_ds_init_called, allow_all_kernels) in 5.24
            contexts = cls.get_init_context(dtype, False, False, None)
        except TypeError:  # earlier 5.x: without allow_all_kernels
            contexts = cls.get_init_context(dtype, False, False)
    except (AttributeError, TypeError) as e:
        raise HandoffError(f"transformers {transformers.__version__}: {cls.__name__}.get_init_context is not the "
                           f"one the hand-off knows ({e})", missing=[f"{cls.__name__}.get_init_context"]) from None
    with tf["ContextManagers"](contexts):
        model = cls(copy.deepcopy(config))
        try:
            from transformers.modeling_utils import patch_output_recorders
        except ImportError:
            pass
        else:
            patch_output_recorders(model)
    return model


def _targets(model: Any, ckpt: Any, dtype: torch.dtype, tf: dict[str, Any]
             ) -> tuple[list[Target], list[str], list[Any]]:
    """Each model tensor the checkpoint fills, its sources and conversion
    (found the way transformers' loader finds them), and the checkpoint
    tensors transformers would not load."""
    mapping = tf["get_model_conversion_mapping"](model, None, None)
    renamings = [w for w in mapping if isinstance(w, tf["WeightRenaming"])]
    converters = [w for w in mapping if isinstance(w, tf["WeightConverter"])]
    by_pattern = {p: c for c in converters for p in c.source_patterns}
    meta = model.state_dict()
    prefix = model.base_model_prefix
    plan_dtypes = model._get_dtype_plan(dtype) if hasattr(model, "_get_dtype_plan") else {}
    alt = by_group = None
    if plan_dtypes:
        alt, by_group, _ = tf["build_glob_alternation"](list(plan_dtypes))

    groups: dict[str, tuple[Any, dict[str, list[str]]]] = {}
    skipped: list[str] = []
    for key in sorted(ckpt.keys(), key=tf["dot_natural_key"]):
        renamed, pattern = tf["rename_source_key"](key, renamings, converters, prefix, meta)
        if renamed not in meta and key in meta:
            renamed, pattern = tf["rename_source_key"](key, [], [], prefix, meta)
        if renamed not in meta:
            skipped.append(key)
            continue
        conv = by_pattern[pattern] if pattern is not None else None
        entry = groups.setdefault(renamed, (conv, {}))
        if entry[0] is not conv:
            raise HandoffError(f"checkpoint tensors map to '{renamed}' through different conversions",
                               missing=[renamed])
        entry[1].setdefault(pattern if pattern is not None else key, []).append(key)

    targets: list[Target] = []
    for name in meta:  # the model's order: layer by layer
        if name not in groups:
            continue
        conv, srcs = groups[name]
        # transformers' rule: the dtype plan's (keep-in-fp32 modules), else
        # the parameter's own (built under the requested default dtype)
        want = meta[name].dtype
        if alt is not None and (m := alt.search(name)) is not None:
            want = plan_dtypes[by_group[m.lastgroup]]
        fmt = _FORMATS.get(want)
        if fmt is None:
            raise HandoffError(f"transformers parameter '{name}' is {want}, which no hf2q device format holds",
                               missing=[str(want)])
        if conv is None:
            if len(srcs) != 1 or len(next(iter(srcs.values()))) != 1:
                raise HandoffError(f"several checkpoint tensors are renamed to '{name}': "
                                   f"{sorted(k for v in srcs.values() for k in v)}", missing=[name])
            targets.append(Target(name, tuple(meta[name].shape), fmt, srcs))
            continue
        ops: list[tuple[str, int]] = []
        for op in conv.operations:
            if type(op) is tf["MergeModulelist"]:
                ops.append(("merge", int(op.dim)))
            elif type(op) is tf["Concatenate"]:
                ops.append(("concat", int(op.dim)))
            else:
                raise HandoffError(f"transformers parameter '{name}': conversion op {type(op).__name__} is not "
                                   "supported by hf2q's hand-off (supported: MergeModulelist, Concatenate)",
                                   missing=[type(op).__name__])
        if len(conv.target_patterns) != 1:
            raise HandoffError(f"transformers parameter '{name}': a conversion to {len(conv.target_patterns)} "
                               "tensors is not supported by hf2q's hand-off", missing=[repr(conv)])
        targets.append(Target(name, tuple(meta[name].shape), fmt, srcs, tuple(conv.source_patterns), tuple(ops)))
    return targets, skipped, mapping


def _mark_initialized(model: Any, names: Any) -> None:
    """Flag each tensor filled from the checkpoint as transformers' loader
    does (``_is_hf_initialized``: its initialisation skips them). One walk of
    the module tree; a name per lookup (``get_parameter_or_buffer``) took 35
    us each, 0.025 s for Qwen3.6's 693 tensors."""
    left = set(names)
    for name, t in itertools.chain(model.named_parameters(remove_duplicate=False),
                                   model.named_buffers(remove_duplicate=False)):
        if name in left:
            t._is_hf_initialized = True
            left.discard(name)
    for name in left:  # what the walk does not reach (a module's extra state)
        model.get_parameter_or_buffer(name)._is_hf_initialized = True


def from_pretrained(path_or_repo: PathLike, device: Any = None, *, dtype: str = "keep",
                    revision: str | None = None, download: bool = False, progress: bool = False) -> Any:
    """transformers' own model for the checkpoint at ``path_or_repo`` (a
    directory with ``config.json``, or a Hugging Face repo id in the local
    cache; ``revision``, ``download``: see :func:`hf2q.hub.resolve`), its
    weights hf2q buffers on ``device`` (an :class:`hf2q.Device`, a kind such
    as ``"cuda"`` or ``"host"``/``"cpu"``; default :meth:`hf2q.Device.default`).

    ``dtype``: ``"keep"`` (the config's dtype, as transformers'
    ``dtype="auto"``), ``"bf16"``, ``"f16"`` or ``"f32"``; modules transformers
    keeps in float32 (under float16 also ``_keep_in_fp32_modules``) stay
    float32, as they do there. Returns the model in eval mode,
    its buffers (with their load summary) as ``model.hf2q_model``.

    Raises :class:`HandoffError` for what transformers or the hand-off
    cannot do (architecture, version, conversion, dtype, a model tensor the
    checkpoint lacks), and hf2q's usual errors for bad files."""
    from .hub import resolve
    from .loader import execute
    from .models import read_config
    from .safetensors import open_checkpoint

    tf = _internals()
    path = Path(resolve(path_or_repo, revision, download=download, api="hf2q.transformers.from_pretrained"))
    directory = path if path.is_dir() else path.parent
    _, raw = read_config(directory)  # hf2q's checks first: a typed ConfigError for a bad file
    if raw is None:
        raise HandoffError(f"{directory}: no config.json; transformers needs one to pick the model class",
                           missing=["config.json"])
    try:
        config = transformers.AutoConfig.from_pretrained(str(directory))
    except (ValueError, KeyError) as e:
        raise HandoffError(f"{directory}: transformers {transformers.__version__} cannot read this config "
                           f"(model_type {raw.get('model_type')!r}): {e}",
                           missing=[str(raw.get("model_type"))]) from None
    cls = _model_class(config)
    torch_dtype = _torch_dtype(dtype, config)
    opening = _opening(device)
    try:
        model = _build(cls, config, torch_dtype, tf)
        meta_keys = set(model.state_dict())
        tied = set(getattr(model, "all_tied_weights_keys", {}) or {})
        with open_checkpoint(path) as ckpt:
            targets, skipped, mapping = _targets(model, ckpt, torch_dtype, tf)
            # Refused before a byte is read: transformers would initialise these at random.
            lacking = sorted(meta_keys - {t.name for t in targets} - tied)
            if lacking:
                raise HandoffError(f"{path}: the checkpoint has no tensor for {len(lacking)} parameter(s) of "
                                   f"{cls.__name__}: {', '.join(lacking[:8])}{' ...' if len(lacking) > 8 else ''}",
                                   missing=lacking)
            plan = plan_handoff(ckpt, targets, config=config, skipped=skipped)
            dev = resolve_device(opening)

            # Tying reads weights: transformers compares the two ends of a tied
            # pair that are both in the checkpoint (and ties only equal ones),
            # and pads a tied output layer's bias into a new tensor. A model
            # that ties anything is assembled once every byte has landed, from
            # views that wait for the copies still in flight (a GPU's reads
            # run on torch's stream, not on the ones hf2q copied with).
            early = not tied

            def assemble(bufs: dict[str, Any]) -> HandoffModel:
                """transformers' model given the buffers, the way its own
                loader finishes one. On a GPU, for a model that ties nothing,
                this runs while the load's last batch is still being written
                (``make_early``): it reads no weight, and its views do not wait
                for the device (the load synchronizes once it has returned)."""
                try:
                    loaded = HandoffModel(dev, config, bufs)
                    sd = _state_dict(loaded.named_buffers(), not early)
                    model.load_state_dict(sd, strict=False, assign=True)
                    _mark_initialized(model, sd)
                    tdev = next(iter(sd.values())).device if sd else torch.device("cpu")
                    info = tf["LoadStateDictInfo"](missing_keys=meta_keys - set(sd), unexpected_keys=set(skipped),
                                                   mismatched_keys=set(), error_msgs=[], conversion_errors={},
                                                   skipped_pp_keys=set())
                    cfg = tf["LoadStateDictConfig"](pretrained_model_name_or_path=str(path), device_map={"": tdev},
                                                    dtype=torch_dtype, dtype_plan=model._get_dtype_plan(torch_dtype),
                                                    weight_mapping=mapping)
                    # transformers' own finish: non-persistent buffers (RoPE
                    # tables) computed on the device, tied weights tied, the
                    # loading report. Loaded tensors are flagged initialized, so
                    # its initialisation does not touch them.
                    cls._finalize_model_loading(model, cfg, info)
                    return loaded
                except Exception as e:
                    # execute() raises it without its frames (they hold buffers): say where it came from
                    if hasattr(e, "add_note"):
                        e.add_note("raised while transformers' model was assembled from hf2q's buffers, at:\n"
                                   + "".join(traceback.format_tb(e.__traceback__)[-4:]).rstrip())
                    raise

            loaded: HandoffModel | None = None
            try:
                loaded = execute(plan, ckpt, dev, assemble, progress=progress, make_early=early,
                                 extra={"architecture": cls.__name__, "dtype": dtype})
                dev.synchronize()  # views made early did not wait for the uploads in flight
            except BaseException as e:
                model = loaded = None  # the traceback keeps this frame: not the buffers the model holds
                raise _detached(e)
    finally:
        close_device(opening)  # after a failure above: no opening thread is left running
    model._weight_conversions = [w for w in mapping if w.was_used()]  # save_pretrained writes the checkpoint's layout
    on_meta = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if on_meta:
        raise HandoffError(f"{path}: {len(on_meta)} tensor(s) of {cls.__name__} were left unfilled: "
                           f"{', '.join(on_meta[:8])}", missing=on_meta)
    model.eval()
    if model.can_generate() and (directory / "generation_config.json").is_file():
        model.generation_config = transformers.GenerationConfig.from_pretrained(str(directory))
    model.hf2q_model = loaded
    return model
