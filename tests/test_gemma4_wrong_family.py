"""hf2q.gemma4 refuses another family's checkpoint up front: a config.json
whose model_type is not gemma4 / gemma4_text is a ConfigError naming the file,
the model_type found and the ones the Gemma 4 loader reads (as hf2q.qwen35 and
hf2q.dflash do), not a confusing error about some later key or tensor."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

import hf2q
from hf2q import ConfigError
from hf2q.testing import make_dflash_checkpoint, make_gemma4_checkpoint, make_qwen35_moe_checkpoint


def _host() -> hf2q.Device:
    return hf2q.Device._isolated("host")


def _load(path: Path) -> Any:
    return hf2q.gemma4.load(path, _host(), progress=False)


def _inspect(path: Path) -> Any:
    return hf2q.gemma4.inspect(path)


def _load_as_family(path: Path) -> Any:
    """The registry's path with the family named: its plan step parses the config."""
    return hf2q.load(path, _host(), family="gemma4", progress=False)


ENTRY_POINTS = [pytest.param(_load, id="load"), pytest.param(_inspect, id="inspect"),
                pytest.param(_load_as_family, id="hf2q.load-family")]


def _edit_config(path: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    p = path / "config.json"
    d = json.loads(p.read_text())
    edit(d)
    p.write_text(json.dumps(d))


def _assert_wrong_family(exc: pytest.ExceptionInfo[ConfigError], path: Path, found: str,
                         key: str = "model_type") -> None:
    msg = str(exc.value)
    assert str(path / "config.json") in msg
    assert repr(found) in msg
    assert "gemma4 / gemma4_text" in msg
    assert "Gemma 4" in msg
    assert exc.value.key == key
    assert len(msg.splitlines()) == 1  # one plain line, not a listing of tensors


# ----------------------------------------------------------------------------- other families
@pytest.mark.parametrize("entry", ENTRY_POINTS)
@pytest.mark.parametrize("multimodal", [False, True], ids=["text", "multimodal"])
def test_qwen35_moe_checkpoint_is_refused(tmp_path: Path, entry: Callable[[Path], Any], multimodal: bool) -> None:
    ck = make_qwen35_moe_checkpoint(tmp_path / "q", "tiny", multimodal=multimodal)
    with pytest.raises(ConfigError) as exc:
        entry(ck)
    _assert_wrong_family(exc, ck, "qwen3_5_moe" if multimodal else "qwen3_5_moe_text")
    assert "layer_types" not in str(exc.value)


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_dflash_drafter_is_refused(tmp_path: Path, entry: Callable[[Path], Any]) -> None:
    ck = make_dflash_checkpoint(tmp_path / "d", "tiny")
    with pytest.raises(ConfigError) as exc:
        entry(ck)
    _assert_wrong_family(exc, ck, "qwen3")


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_generic_checkpoint_is_refused(tmp_path: Path, entry: Callable[[Path], Any]) -> None:
    from safetensors.numpy import save_file

    ck = tmp_path / "foo"
    ck.mkdir()
    (ck / "config.json").write_text(json.dumps({"model_type": "foo", "architectures": ["FooForCausalLM"],
                                                "hidden_size": 8}))
    save_file({f"w{i}": np.zeros((2, 8), np.float32) for i in range(4)}, str(ck / "model.safetensors"))
    with pytest.raises(ConfigError) as exc:
        entry(ck)
    _assert_wrong_family(exc, ck, "foo")
    assert "num_hidden_layers" not in str(exc.value)


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_wrapper_with_another_text_model_type_is_refused(tmp_path: Path, entry: Callable[[Path], Any]) -> None:
    ck = make_gemma4_checkpoint(tmp_path / "g", wrapper=True)

    def edit(d: dict[str, Any]) -> None:
        d["text_config"]["model_type"] = "qwen3_5_moe_text"

    _edit_config(ck, edit)
    with pytest.raises(ConfigError) as exc:
        entry(ck)
    _assert_wrong_family(exc, ck, "qwen3_5_moe_text", key="text_config.model_type")


def test_non_string_model_type_is_refused(tmp_path: Path) -> None:
    ck = make_gemma4_checkpoint(tmp_path / "g")
    _edit_config(ck, lambda d: d.update(model_type=7))
    with pytest.raises(ConfigError, match="model_type") as exc:
        _inspect(ck)
    assert exc.value.key == "model_type"


# ----------------------------------------------------------------------------- Gemma 4 still loads
@pytest.mark.parametrize("wrapper", [False, True], ids=["causal_lm", "conditional_generation"])
def test_gemma4_checkpoint_still_loads(tmp_path: Path, wrapper: bool) -> None:
    ck = make_gemma4_checkpoint(tmp_path / "g", wrapper=wrapper)
    info = _inspect(ck)
    assert info["planned_tensors"] > 0
    model = _load(ck)
    assert model.family == "gemma4"
    assert model.config.num_hidden_layers == 2
    assert model["token_embd.weight"] is model.embed_tokens
    assert _load_as_family(ck).family == "gemma4"


@pytest.mark.parametrize("where", ["root", "all"])
def test_config_without_model_type_still_loads(tmp_path: Path, where: str) -> None:
    """No model_type (or null) is not another family's: transformers' defaults apply, as before."""
    ck = make_gemma4_checkpoint(tmp_path / "g", wrapper=True)

    def edit(d: dict[str, Any]) -> None:
        d["model_type"] = None
        if where == "all":
            del d["text_config"]["model_type"]

    _edit_config(ck, edit)
    assert _inspect(ck)["planned_tensors"] > 0
    assert _load(ck).config.wrapper


def test_published_gemma4_data_still_loads() -> None:
    data = Path(__file__).parent / "data" / "gemma4" / "gemma4_moe_causal_lm" / "hf"
    assert _load(data).family == "gemma4"


def test_checkpoint_without_config_json_keeps_its_error(tmp_path: Path) -> None:
    ck = make_gemma4_checkpoint(tmp_path / "g")
    (ck / "config.json").unlink()
    for entry in (_load, _inspect):
        with pytest.raises(ConfigError, match="config file not found"):
            entry(ck)
