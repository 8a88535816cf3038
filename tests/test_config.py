"""The configuration registry: coverage of the specification, typed parsing, rendering."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys

import pytest

from torch_neuronx import config, log

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPEC = os.path.join(ROOT, "docs", "torchneuron-environment-variables.txt")
_ROW = re.compile(r"^([A-Z][A-Z0-9_]+)\t(bool|int|str|path)\t([^\t]*)\t")


def spec_rows() -> list[tuple[str, str, str]]:
    with open(SPEC) as f:
        return [m.groups() for m in map(_ROW.match, f) if m]


def test_registry_has_every_specified_variable_with_its_type():
    rows = spec_rows()
    assert len(rows) >= 35
    for name, typ, _ in rows:
        assert config.var(name).type == typ, name
    assert config.var("TORCH_NEURONX_DYNAMO_TENSOR_DUMPS")
    assert config.var("TORCH_NEURONX_SEGMENT_ALLOCATOR_CONFIG")


@pytest.mark.parametrize("name,typ,default", spec_rows())
def test_default_matches_specification(name, typ, default, monkeypatch):
    monkeypatch.delenv(name, raising=False)
    entry = config.var(name)
    if typ == "bool" and default in ("True", "False", "1", "0"):
        assert config.get(name) is (default in ("True", "1"))
    elif typ == "int":
        assert config.get(name) == int(default)
    else:
        assert entry.documented_default().strip('"') == default.strip('"').replace("\"\"", ""), name


@pytest.mark.parametrize("raw,expected", [
    ("1", True), ("0", False), ("true", True), ("FALSE", False), ("Yes", True), ("nO", False), (" 1 ", True),
])
def test_bool_accepts_documented_spellings(raw, expected, monkeypatch):
    monkeypatch.setenv("TORCH_NEURONX_PRESERVE_COMPILATION_ARTIFACTS", raw)
    assert config.get("TORCH_NEURONX_PRESERVE_COMPILATION_ARTIFACTS") is expected


def test_malformed_value_warns_once_and_uses_default(monkeypatch, caplog):
    monkeypatch.setenv("TORCH_NEURONX_NEFF_CACHE_LOCK_TIMEOUT", "ten minutes")
    with caplog.at_level(logging.WARNING, logger="torch_neuronx.config"):
        assert config.get("TORCH_NEURONX_NEFF_CACHE_LOCK_TIMEOUT") == 1200
        assert config.get("TORCH_NEURONX_NEFF_CACHE_LOCK_TIMEOUT") == 1200
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1
    assert "TORCH_NEURONX_NEFF_CACHE_LOCK_TIMEOUT" in warnings[0]
    assert "ten minutes" in warnings[0] and "decimal integer" in warnings[0]


def test_malformed_bool_names_accepted_values(monkeypatch, caplog):
    monkeypatch.setenv("TORCH_NEURONX_COMPILE_ONLY", "maybe")
    with caplog.at_level(logging.WARNING, logger="torch_neuronx.config"):
        assert config.get("TORCH_NEURONX_COMPILE_ONLY") is False
    assert "TORCH_NEURONX_COMPILE_ONLY" in caplog.text and "'maybe'" in caplog.text
    assert "true" in caplog.text and "yes" in caplog.text


def test_streams_flag_accepts_only_0_and_1(monkeypatch, caplog):
    monkeypatch.setenv("TORCH_NEURONX_ENABLE_STREAMS", "true")
    with caplog.at_level(logging.WARNING, logger="torch_neuronx.config"):
        assert config.get("TORCH_NEURONX_ENABLE_STREAMS") is True  # the default
    assert "only 0 and 1" in caplog.text
    monkeypatch.setenv("TORCH_NEURONX_ENABLE_STREAMS", "0")
    assert config.get("TORCH_NEURONX_ENABLE_STREAMS") is False


def test_split_collectives_only_1_enables(monkeypatch):
    monkeypatch.delenv("NEURON_USE_SPLIT_ALLGATHER", raising=False)
    assert config.get("NEURON_USE_SPLIT_ALLGATHER") is None  # unset: depends on the stream
    monkeypatch.setenv("NEURON_USE_SPLIT_ALLGATHER", "1")
    assert config.get("NEURON_USE_SPLIT_ALLGATHER") is True
    monkeypatch.setenv("NEURON_USE_SPLIT_ALLGATHER", "true")
    assert config.get("NEURON_USE_SPLIT_ALLGATHER") is False


def test_option_overrides_environment_and_reports_source(monkeypatch):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "cpu")
    assert config.lookup("NEURON_PLATFORM_TARGET_OVERRIDE") == ("cpu", "environment")
    with config.override(NEURON_PLATFORM_TARGET_OVERRIDE="cuda"):
        assert config.lookup("NEURON_PLATFORM_TARGET_OVERRIDE") == ("cuda", "option")
    monkeypatch.delenv("NEURON_PLATFORM_TARGET_OVERRIDE")
    assert config.lookup("NEURON_PLATFORM_TARGET_OVERRIDE") == (None, "default")


def test_overrides_belong_to_the_thread_that_set_them():
    import threading

    seen = []
    with config.override(TORCH_NEURONX_COMPILE_ONLY=True):
        thread = threading.Thread(target=lambda: seen.append(config.lookup("TORCH_NEURONX_COMPILE_ONLY")))
        thread.start()
        thread.join()
        assert config.lookup("TORCH_NEURONX_COMPILE_ONLY") == (True, "option")
    assert seen == [(False, "default")]


def test_environment_reads_follow_every_change_of_os_environ(monkeypatch):
    name = "TORCH_NEURONX_METRICS_DIR"
    monkeypatch.delenv(name, raising=False)
    assert config._environ(name) is None
    for value in ("model", "mod\u00e8le", ""):
        monkeypatch.setenv(name, value)
        assert config._environ(name) == os.environ[name] == value
        assert config.get(name) == value
    os.environ.update({name: "updated"})
    assert config.get(name) == "updated"
    monkeypatch.delenv(name)
    assert config._environ(name) is None


def test_unknown_variable_is_a_clear_error():
    with pytest.raises(KeyError, match="not a torch_neuronx configuration variable"):
        config.get("TORCH_NEURONX_NO_SUCH_THING")


def test_cli_prints_every_variable_with_value_and_source():
    env = {**os.environ, "TORCH_NEURONX_LOG_LEVEL": "3", "TORCH_NEURONX_METRICS_DIR": "/tmp/m"}
    out = subprocess.run([sys.executable, "-m", "torch_neuronx.config"], env=env, capture_output=True,
                         text=True, check=True).stdout
    lines = {line.split()[0]: line.split()[1:] for line in out.splitlines()[1:]}
    assert set(lines) == {v.name for v in config.variables()}
    assert lines["TORCH_NEURONX_LOG_LEVEL"] == ["3", "environment"]
    assert lines["TORCH_NEURONX_PRESERVE_COMPILATION_ARTIFACTS"] == ["0", "default"]


def test_environment_doc_is_generated_from_registry():
    with open(os.path.join(ROOT, "docs", "environment.md")) as f:
        assert f.read() == config.render_markdown(), "docs/environment.md is stale: run `make docs`"


def test_unbuilt_features_are_marked_in_the_doc():
    doc = config.render_markdown()
    for entry in config.variables():
        row = next(line for line in doc.splitlines() if line.startswith(f"| `{entry.name}` |"))
        assert entry.status in row


@pytest.mark.parametrize("level,expected", [("0", logging.ERROR), ("1", logging.WARNING),
                                            ("2", logging.INFO), ("3", logging.DEBUG), ("7", logging.WARNING)])
def test_log_level_sets_the_torch_neuronx_logger(level, expected, monkeypatch):
    monkeypatch.setenv("TORCH_NEURONX_LOG_LEVEL", level)
    try:
        assert log.configure().level == expected
        assert logging.getLogger("torch_neuronx.compiler.driver").getEffectiveLevel() == expected
    finally:
        monkeypatch.delenv("TORCH_NEURONX_LOG_LEVEL")
        log.configure()
