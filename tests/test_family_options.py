"""Family options (``expert_dtype``, ``dense_dtype``, ``mtp``, ``dtype``) are
never dropped: one the checkpoint's family does not take is a TypeError naming
the option and the family in ``hf2q.load`` and ``hf2q.models.inspect`` alike,
a usage error (exit 2) in ``hf2q inspect`` and ``hf2q load``; one it takes
changes what is planned, and ``inspect`` shows what ``load`` would make."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

import hf2q
from hf2q import models
from hf2q.cli import main
from hf2q.safetensors import open_checkpoint
from hf2q.testing import make_dflash_checkpoint, make_qwen35_moe_checkpoint

GEMMA = Path(__file__).parent / "data" / "gemma4" / "gemma4_moe_causal_lm" / "hf"

#: per family: an option it does not take (with a valid value), and the ones it takes
FOREIGN = {"dflash": ("dtype", "f32"), "qwen35moe": ("dtype", "q8_0"), "gemma4": ("mtp", False),
           "generic": ("expert_dtype", "bf16")}
TAKES = {"dflash": "it takes none", "qwen35moe": "it takes expert_dtype, dense_dtype, mtp",
         "gemma4": "it takes expert_dtype, dense_dtype", "generic": "it takes dtype"}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("families")
    generic = root / "generic"
    generic.mkdir()
    rng = np.random.default_rng(0)
    save_file({"proj.weight": rng.standard_normal((8, 64)).astype(np.float32)}, str(generic / "model.safetensors"))
    return {"dflash": make_dflash_checkpoint(root / "dflash", "tiny"),
            "qwen35moe": make_qwen35_moe_checkpoint(root / "qwen", "tiny"), "gemma4": GEMMA, "generic": generic}


def _inspect(path: Path, **options: object) -> tuple[str, dict]:
    _, config = models.read_config(path)
    with open_checkpoint(path) as ckpt:
        fam, plan = models.inspect(ckpt, config, **options)
    return fam.name, plan


@pytest.mark.parametrize("family", list(FOREIGN))
def test_an_option_the_family_does_not_take_is_a_type_error(family: str, checkpoints: dict[str, Path]) -> None:
    path = checkpoints[family]
    option, value = FOREIGN[family]
    message = f"the {family} family takes no option.s. {option}; {TAKES[family]}"
    with pytest.raises(TypeError, match=message):
        _inspect(path, **{option: value})
    with pytest.raises(TypeError, match=message):
        hf2q.load(path, hf2q.Device("host"), progress=False, **{option: value})
    with pytest.raises(TypeError, match=message):  # a forced family is checked the same way
        hf2q.load(path, hf2q.Device("host"), family=family, progress=False, **{option: value})
    assert _inspect(path)[0] == family


def test_every_unknown_option_is_named(checkpoints: dict[str, Path]) -> None:
    with pytest.raises(TypeError, match="takes no option.s. dtype, quantize"):
        _inspect(checkpoints["gemma4"], quantize=True, dtype="f32", dense_dtype="bf16")


def test_inspect_uses_the_options_it_is_given(checkpoints: dict[str, Path]) -> None:
    """An option the family takes changes the plan inspect reports (it was never silently dropped)."""
    for family, option, value in (("qwen35moe", "expert_dtype", "bf16"), ("gemma4", "dense_dtype", "q8_0"),
                                  ("generic", "dtype", "bf16")):
        _, default = _inspect(checkpoints[family])
        _, chosen = _inspect(checkpoints[family], **{option: value})
        assert chosen["gpu_resident_bytes"] != default["gpu_resident_bytes"], family
    _, no_mtp = _inspect(checkpoints["qwen35moe"], mtp=False)
    assert no_mtp["planned_tensors"] < _inspect(checkpoints["qwen35moe"])[1]["planned_tensors"]


# --------------------------------------------------------------------------- the command line

@pytest.mark.parametrize("command", ["inspect", "load"])
@pytest.mark.parametrize(("family", "flag", "offered"), [
    ("qwen35moe", "--dtype", "--expert-dtype, --dense-dtype, --recipe"),  # mtp is Python-only: not offered
    ("gemma4", "--dtype", "--expert-dtype, --dense-dtype, --recipe"),
    ("generic", "--dense-dtype", "--dtype, --recipe"),
    ("dflash", "--expert-dtype", "no options"),
])
def test_cli_refuses_a_flag_the_family_does_not_take(command: str, family: str, flag: str, offered: str,
                                                     checkpoints: dict[str, Path], capsys) -> None:
    path = checkpoints[family]
    extra = ["--device", "host", "--no-progress"] if command == "load" else []
    assert main([command, str(path), flag, "bf16", *extra]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == (f"hf2q {command}: error: {flag} does not apply to {path}: the {family} family "
                                 f"takes {offered}\n")
    assert main([command, str(path), flag, "bf16", "--json", *extra]) == 2
    e = json.loads(capsys.readouterr().out)["error"]
    assert e["type"] == "UsageError" and flag in e["message"]


@pytest.mark.parametrize(("family", "argv", "device_dtype"), [
    ("gemma4", ["--dense-dtype", "q8_0"], "q8_0"),
    ("gemma4", ["--expert-dtype", "bf16"], "bf16"),
    ("qwen35moe", ["--expert-dtype", "f32", "--dense-dtype", "bf16"], "bf16"),
    ("generic", ["--dtype", "q8_0"], "q8_0"),
])
def test_cli_inspect_shows_what_load_makes(family: str, argv: list[str], device_dtype: str,
                                           checkpoints: dict[str, Path], capsys) -> None:
    path = str(checkpoints[family])
    assert main(["inspect", path, "--json"]) == 0
    default = json.loads(capsys.readouterr().out)
    assert main(["inspect", path, "--json", *argv]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert main(["load", path, "--json", "--device", "host", *argv]) == 0
    loaded = json.loads(capsys.readouterr().out)
    assert shown["resident_bytes"] == loaded["resident_bytes"] != default["resident_bytes"]
    planned = shown.get("gguf_tensors") or [{"dtype": r["device_dtype"]} for r in shown["tensor_list"]]
    assert device_dtype in {t["dtype"] for t in planned}


def test_every_family_has_the_protocols_signatures(checkpoints: dict[str, Path]) -> None:
    """model / target_heads / describe take what ModelFamily declares (a
    LoadPlan), and DFlash's plan takes **options: a family narrows nothing
    under ``# type: ignore[override]``; what it cannot take it refuses at run
    time with a TypeError."""
    import inspect

    from hf2q.models.base import ModelFamily
    from hf2q.plan import LoadPlan

    for fam in models.FAMILIES:
        impl = type(fam.impl())
        src = inspect.getsource(inspect.getmodule(impl))  # type: ignore[arg-type]
        assert "type: ignore[override]" not in src, fam.name
        for method in ("model", "target_heads", "describe"):
            if getattr(impl, method) is getattr(ModelFamily, method):
                continue
            base = inspect.signature(getattr(ModelFamily, method)).parameters
            ours = inspect.signature(getattr(impl, method)).parameters
            assert [(p.name, p.annotation, p.kind) for p in ours.values()] == \
                [(p.name, p.annotation, p.kind) for p in base.values()], (fam.name, method)
    qwen = models.family("qwen35moe").impl()
    other = LoadPlan("generic", [])
    for call in (lambda: qwen.model(hf2q.Device("host"), other, {}), lambda: qwen.target_heads(other),
                 lambda: qwen.describe(other, None)):  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"needs a Qwen3.5 MoE plan \(Qwen35Plan.*got LoadPlan of family 'generic'"):
            call()
    dflash = models.family("dflash").impl()
    assert inspect.signature(type(dflash).plan).parameters["options"].kind is inspect.Parameter.VAR_KEYWORD
    with open_checkpoint(checkpoints["dflash"]) as ckpt:
        cfg = dflash.parse_config(ckpt, None)
        assert len(dflash.plan(ckpt, cfg)) > 0
        with pytest.raises(TypeError, match=r"the dflash family takes no option\(s\) dtype; it takes none"):
            dflash.plan(ckpt, cfg, dtype="f32")
        with pytest.raises(TypeError, match="dflash: plan.. needs a DFlashConfig"):
            dflash.plan(ckpt, {"hidden_size": 1})
