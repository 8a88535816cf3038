"""Cache keys: debug info does not matter, each input changes exactly its own component."""

from __future__ import annotations

import enum
import logging
import pathlib

import pytest

from torch_neuronx.cache import keys
from torch_neuronx.format import neff

HLO = """\
module @jit_add {
  func.func @main(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> {
    %0 = stablehlo.add %a, %b : tensor<4xf32>
    return %0 : tensor<4xf32>
  }
}
"""

HLO_WITH_DEBUG_INFO = """\
// lowered by torch-mlir from model.py
#loc = loc(unknown)
#loc1 = loc("model.py":12:5)
module @jit_add {
  func.func @main(%a: tensor<4xf32> loc("a"), %b: tensor<4xf32> loc(fused[#loc1, "b"])) -> tensor<4xf32> {
    %0 = stablehlo.add %a, %b : tensor<4xf32> loc(callsite("add"("model.py":3:1) at #loc1))  // the sum
    return %0 : tensor<4xf32> loc(#loc)
  } loc(#loc1)
} loc(#loc)
"""

CONFIG = {"target": "cpu", "flags": ["--iree-llvmcpu-target-cpu=host"], "opt_level": 2}


def _key(hlo: str = HLO, config: dict | None = None, version: str = "3.13.0") -> keys.CacheKey:
    return keys.neff_key(hlo, CONFIG if config is None else config, version, graph_id="add")


def _changed(a: keys.CacheKey, b: keys.CacheKey) -> list[str]:
    return [name for name in a.components if a.components[name] != b.components[name]]


def test_components_come_in_a_fixed_order():
    assert list(_key().components) == ["hlo", "compiler_config", "compiler_version", "neff_format_version"]
    assert len(_key().digest) == 64


def test_locations_and_comments_do_not_change_the_digest():
    assert _key(HLO_WITH_DEBUG_INFO).digest == _key(HLO).digest
    assert keys.strip_debug_info(HLO_WITH_DEBUG_INFO) == keys.strip_debug_info(HLO)


def test_hlo_bytes_and_text_give_the_same_digest():
    assert _key(HLO.encode()).digest == _key(HLO).digest


def test_loc_inside_a_string_literal_is_kept():
    text = 'func.func @f() attributes {note = "loc(x) // not a comment"} loc("f")\n'
    assert keys.strip_debug_info(text) == 'func.func @f() attributes {note = "loc(x) // not a comment"}\n'


def test_identifiers_ending_in_loc_are_not_stripped():
    text = "%0 = call @myloc(%a) : (f32) -> f32\n"
    assert keys.strip_debug_info(text) == text


def test_changing_the_hlo_changes_only_the_hlo_component():
    other = _key(HLO.replace("stablehlo.add", "stablehlo.multiply"))
    assert _changed(_key(), other) == ["hlo"]
    assert other.digest != _key().digest


@pytest.mark.parametrize("field, value", [("target", "cuda"), ("flags", ["--iree-opt-data-tiling"]),
                                          ("opt_level", 3)])
def test_changing_a_compiler_setting_changes_only_compiler_config(field, value):
    other = _key(config={**CONFIG, field: value})
    assert _changed(_key(), other) == ["compiler_config"]
    assert other.digest != _key().digest


def test_changing_the_compiler_version_changes_only_compiler_version():
    assert _changed(_key(), _key(version="3.14.0")) == ["compiler_version"]


def test_neff_format_version_is_a_component(monkeypatch):
    before = _key()
    monkeypatch.setattr(neff, "FORMAT_VERSION", neff.FORMAT_VERSION + 1)
    assert _changed(before, _key()) == ["neff_format_version"]


def test_config_key_order_does_not_matter():
    reordered = dict(reversed(list(CONFIG.items())))
    assert _key(config=reordered).digest == _key().digest


def test_config_values_are_canonicalised():
    class Level(enum.Enum):
        O2 = 2

    a = keys.neff_key(HLO, {"dir": pathlib.Path("/x"), "level": Level.O2, "flags": ("a",)}, "v")
    b = keys.neff_key(HLO, {"dir": "/x", "level": 2, "flags": ["a"]}, "v")
    assert a.digest == b.digest


def test_values_without_a_stable_text_form_are_rejected():
    with pytest.raises(TypeError, match="compiler_config.fn"):
        keys.neff_key(HLO, {"fn": object()}, "v")


def test_graph_id_names_the_key_but_is_not_hashed():
    a = keys.neff_key(HLO, CONFIG, "v", graph_id="one")
    b = keys.neff_key(HLO, CONFIG, "v", graph_id="two")
    assert a.digest == b.digest and a.label() == "one" and a.group != b.group


def test_mlir_bytecode_is_hashed_as_given():
    blob = b"ML\xefR" + b"\x00loc(" + b"\x01" * 10
    assert keys.hlo_bytes(blob) == blob


def test_base_key_has_graph_and_input_spec_components():
    key = keys.base_key("graph():\n  add", [((4,), "float32"), ((4,), "float32")], CONFIG, "v")
    assert list(key.components) == ["graph", "input_specs", "compiler_config", "compiler_version",
                                    "neff_format_version"]
    other = keys.base_key("graph():\n  add", [((8,), "float32"), ((4,), "float32")], CONFIG, "v")
    assert [n for n in key.components if key.components[n] != other.components[n]] == ["input_specs"]
    assert key.kind == "base" and key.digest != _key().digest


def test_cache_key_follows_TORCH_NEURONX_NEFF_KEY_FROM_HLO(monkeypatch):
    args = dict(hlo=HLO, graph_repr="g", input_specs=[], compiler_config=CONFIG, compiler_version="v")
    monkeypatch.delenv("TORCH_NEURONX_NEFF_KEY_FROM_HLO", raising=False)
    assert keys.cache_key(**args).kind == "hlo"
    monkeypatch.setenv("TORCH_NEURONX_NEFF_KEY_FROM_HLO", "0")
    assert keys.cache_key(**args).kind == "base"


def test_each_component_hash_is_logged_at_debug():
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("torch_neuronx.cache")
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        key = _key()
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
    text = "\n".join(r.getMessage() for r in records)
    for name, digest in key.components.items():
        assert f"component {name}: {digest}" in text
    assert key.digest in text
