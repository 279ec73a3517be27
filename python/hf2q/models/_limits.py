"""Bounds on the numbers a config.json states (issue 11: cost bounded by the
checkpoint, never by a number in a config).

Work that follows a config number (a manifest of ``11 * num_hidden_layers``
entries, a plan over ``num_experts`` experts per layer) is bounded here, at
parse time, with a clear message, before anything scales with it. The limits
sit far above every published model (given beside each), so no real
checkpoint meets them; the work beyond parsing is then compared with the
checkpoint's own tensor count.
"""

from __future__ import annotations

from ..errors import ConfigError

#: key -> (largest accepted value, the largest published value we know of).
LIMITS: dict[str, tuple[int, str]] = {
    "num_hidden_layers": (1024, "about 128 layers"),
    "mtp_num_hidden_layers": (64, "1 MTP layer"),
    "num_target_layers": (1024, "about 128 layers"),
    "num_experts": (16384, "512 experts per layer"),
    "num_experts_per_tok": (16384, "10 routed experts per token"),
    "full_attention_interval": (1024, "4"),
    "linear_conv_kernel_dim": (1024, "4"),
}
#: Any other size or count (hidden_size, vocab_size, head_dim, ...).
DEFAULT_LIMIT: tuple[int, str] = (1 << 24, "hidden size 16,384, vocabulary 262,144")
#: Context lengths are positions, not sizes of anything hf2q builds.
UNBOUNDED = {"max_position_embeddings", "mask_token_id", "sliding_window", "block_size"}


def check_bound(key: str, value: int, where: str = "config") -> None:
    """ConfigError when ``value`` of config key ``key`` (dotted names are
    looked up by their last part) is beyond hf2q's limit for it."""
    base = key.rsplit(".", 1)[-1].split("[", 1)[0]
    if base in UNBOUNDED:
        return
    limit, published = LIMITS.get(base, DEFAULT_LIMIT)
    if value > limit:
        shown = str(value) if len(str(value)) <= 24 else f"a {len(str(value))}-digit number"
        raise ConfigError(
            f"{where}: '{key}' = {shown} is beyond hf2q's limit of {limit:,} (published models: {published}); "
            "refused before any work that scales with it",
            key=key,
        )
