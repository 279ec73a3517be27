"""Qwen3.5 / Qwen3.6 MoE (``qwen35moe``): config, tensor plan and reference transforms.

The model-independent half of the loader (docs/QWEN35MOE.md):

- :class:`Qwen35Config` — ``config.json`` (incl. the multimodal ``text_config`` nesting);
- :func:`plan_qwen35_moe` — the ordered :class:`PlannedTensor` list from tensor
  metadata (names, dtypes, shapes; no bytes), with validation;
- :func:`hf_name_to_gguf` / :func:`checkpoint_targets` — the name table of docs/QWEN35MOE.md;
- numpy reference transforms (:func:`transform_tensor`, :func:`convert_reference`,
  :func:`stack_experts_reference`, the V-head reorders, ...).
"""

from __future__ import annotations

from .config import (
    DEFAULT_FULL_ATTENTION_INTERVAL,
    DEFAULT_MROPE_SECTION,
    DEFAULT_PARTIAL_ROTARY_FACTOR,
    DEFAULT_ROPE_THETA,
    FULL_ATTENTION,
    LINEAR_ATTENTION,
    MODEL_TYPES,
    LayerKind,
    Qwen35Config,
)
from .plan import (
    DEVICE_DTYPES,
    SOURCE_DTYPES,
    DeviceDtype,
    DuplicateTensorError,
    MixedExpertFormsError,
    PlannedTensor,
    Qwen35Plan,
    SourcePiece,
    TensorKind,
    Transform,
    UnknownTensorError,
    checkpoint_targets,
    hf_name_to_gguf,
    is_multimodal_tensor,
    plan_qwen35_moe,
    select_device_dtype,
)
from .transforms import (
    a_log_to_ssm_a,
    as_source_array,
    convert_reference,
    device_nbytes,
    norm_plus_one,
    reorder_conv1d,
    reorder_in_proj_ab,
    reorder_in_proj_qkv,
    reorder_in_proj_z,
    reorder_out_proj,
    reorder_per_head,
    reorder_v_heads,
    split_gate_up,
    squeeze_conv1d,
    stack_experts_reference,
    to_device_dtype,
    transform_tensor,
)

from . import config as _config, plan as _plan, transforms as _transforms  # noqa: E402

__all__ = [*_config.__all__, *_plan.__all__, *_transforms.__all__]

# The loader (device upload) lives in its own module.
from .load import Qwen35Layer, Qwen35Model, inspect, load  # noqa: E402

__all__ += ["Qwen35Model", "Qwen35Layer", "load", "inspect"]

# The family interface (hf2q.models.FAMILIES reads FAMILY), not re-exported by hf2q.qwen35.
from .load import FAMILY, NAME, OPTIONS, inspect_checkpoint, load_checkpoint, recognises  # noqa: E402,F401
from .load import load_planned, plan_checkpoint, target_heads  # noqa: E402,F401
