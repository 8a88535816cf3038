"""TORCH_NEURONX_SEGMENT_ALLOCATOR_CONFIG parsing, validation and snapshot-at-first-use."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap

import pytest

from torch_neuronx.memory import allocator_config
from torch_neuronx.memory.allocator import CachingAllocator
from torch_neuronx.memory.allocator_config import SIZE_MAX, AllocatorConfig, parse

ENV = "TORCH_NEURONX_SEGMENT_ALLOCATOR_CONFIG"
MB = 1 << 20


@pytest.fixture
def warnings_log(caplog):
    """caplog, recording the torch_neuronx.memory loggers' warnings."""
    caplog.set_level(logging.WARNING, logger="torch_neuronx.memory")
    return caplog


def messages(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_empty_value_gives_documented_defaults(warnings_log):
    cfg = parse("")
    assert cfg.as_env() == {
        "kPoolBoundary": 1048576, "kSmallSegmentSize": 2097152, "kMediumSegmentSize": 67108864,
        "kMediumThreshold": 16777216, "kSegmentAlignment": 2097152, "kMinRoundedSize": 256,
        "kRoundupPower2Divisions": 4, "kSmallSplitThreshold": 256, "kLargeSplitThreshold": 1048576,
        "kMaxSplitSizeBytes": SIZE_MAX, "kMaxNonSplitRoundingBytes": 20971520,
    }
    assert messages(warnings_log) == []


def test_first_example_caps_splitting(warnings_log):
    cfg = parse("kMaxSplitSizeBytes=536870912,kMaxNonSplitRoundingBytes=67108864")
    assert cfg.max_split_size == 536870912
    assert cfg.max_non_split_rounding == 67108864
    assert cfg.roundup_power2_divisions == 4
    assert messages(warnings_log) == []


def test_second_example_sets_eight_divisions(warnings_log):
    cfg = parse("kRoundupPower2Divisions=8")
    assert cfg == AllocatorConfig(roundup_power2_divisions=8)
    assert messages(warnings_log) == []


def test_whitespace_and_trailing_comma_are_tolerated(warnings_log):
    cfg = parse(" kPoolBoundary = 2097152 , kSmallSegmentSize=4194304,")
    assert (cfg.pool_boundary, cfg.small_segment_size) == (2 * MB, 4 * MB)
    assert messages(warnings_log) == []


def test_size_suffix_is_rejected_with_a_warning(warnings_log):
    cfg = parse("kPoolBoundary=1MB,kSmallSegmentSize=4194304")
    assert cfg.pool_boundary == 1048576  # the default
    assert cfg.small_segment_size == 4194304
    (msg,) = messages(warnings_log)
    assert ENV in msg and "kPoolBoundary" in msg and "'1MB'" in msg
    assert "suffix" in msg and "1048576" in msg


def test_suffix_rejected_even_when_it_would_change_the_value(warnings_log):
    assert parse("kSmallSegmentSize=4MB").small_segment_size == 2 * MB
    assert "suffix" in messages(warnings_log)[0]


def test_unknown_key_is_ignored_with_a_warning(warnings_log):
    cfg = parse("kPoolBoundry=4096,kMinRoundedSize=512")
    assert cfg.pool_boundary == MB and cfg.min_rounded_size == 512
    (msg,) = messages(warnings_log)
    assert ENV in msg and "unknown key 'kPoolBoundry'" in msg and "kPoolBoundary" in msg


@pytest.mark.parametrize("value", ["-5", "0x100", "1.5", "", "abc", "1_000", "+7", str(2**64)])
def test_invalid_value_keeps_the_default(warnings_log, value):
    cfg = parse(f"kMediumThreshold={value}")
    assert cfg.medium_threshold == 16 * MB
    (msg,) = messages(warnings_log)
    assert ENV in msg and "kMediumThreshold" in msg and repr(value) in msg
    assert "decimal integer" in msg and "16777216" in msg


def test_pair_without_equals_sign_is_ignored(warnings_log):
    cfg = parse("kPoolBoundary,kMinRoundedSize=512")
    assert cfg.min_rounded_size == 512
    assert "key=value" in messages(warnings_log)[0]


def test_alignment_must_be_a_power_of_two(warnings_log):
    cfg = parse("kSegmentAlignment=3000000")
    assert cfg.segment_alignment == 2 * MB
    (msg,) = messages(warnings_log)
    assert "kSegmentAlignment" in msg and "'3000000'" in msg and "power of 2" in msg
    assert parse("kSegmentAlignment=4194304").segment_alignment == 4 * MB


@pytest.mark.parametrize("value", ["0", "65", "1000"])
def test_divisions_out_of_range_keep_the_default(warnings_log, value):
    assert parse(f"kRoundupPower2Divisions={value}").roundup_power2_divisions == 4
    (msg,) = messages(warnings_log)
    assert "kRoundupPower2Divisions" in msg and f"'{value}'" in msg and "[1, 64]" in msg


@pytest.mark.parametrize("value", [1, 2, 16, 64])
def test_divisions_in_range_are_accepted(warnings_log, value):
    assert parse(f"kRoundupPower2Divisions={value}").roundup_power2_divisions == value
    assert messages(warnings_log) == []


def test_non_power_of_two_divisions_warn_about_the_effective_count(warnings_log):
    assert parse("kRoundupPower2Divisions=6").roundup_power2_divisions == 6
    assert "rounding uses 4 divisions" in messages(warnings_log)[0]


def test_split_threshold_defaults_follow_their_knobs():
    cfg = parse("kMinRoundedSize=512,kPoolBoundary=4194304")
    assert cfg.small_split_threshold == 512
    assert cfg.large_split_threshold == 4 * MB
    explicit = parse("kMinRoundedSize=512,kPoolBoundary=4194304,kSmallSplitThreshold=0,"
                     "kLargeSplitThreshold=1024")
    assert (explicit.small_split_threshold, explicit.large_split_threshold) == (0, 1024)


def test_min_rounded_size_must_keep_blocks_aligned(warnings_log):
    assert parse("kMinRoundedSize=100").min_rounded_size == 256
    assert "multiple of 64" in messages(warnings_log)[0]
    assert parse("kMinRoundedSize=0").min_rounded_size == 256


def test_max_split_below_medium_segment_size_is_rejected(warnings_log):
    assert parse("kMaxSplitSizeBytes=1048576").max_split_size == SIZE_MAX
    msg = messages(warnings_log)[0]
    assert "kMaxSplitSizeBytes" in msg and "kMediumSegmentSize" in msg
    ok = parse("kMaxSplitSizeBytes=8388608,kMediumSegmentSize=8388608")
    assert ok.max_split_size == 8 * MB


def test_size_max_itself_is_accepted():
    assert parse(f"kMaxSplitSizeBytes={SIZE_MAX}").max_split_size == SIZE_MAX


def test_config_is_snapshotted_by_a_fresh_allocator(monkeypatch):
    monkeypatch.setattr(allocator_config, "_loaded", None)  # as in a new process
    monkeypatch.setenv(ENV, "kRoundupPower2Divisions=1")
    first = CachingAllocator(0)
    monkeypatch.setenv(ENV, "kRoundupPower2Divisions=8")
    second = CachingAllocator(1)
    assert first.config.roundup_power2_divisions == 1
    assert second.config.roundup_power2_divisions == 1  # parsed once per process
    address = first.malloc(1025)
    assert first.memory_stats()["allocated_bytes.all.current"] == 2048  # still pure powers of two
    first.free(address)
    first.empty_cache()


def test_changing_the_variable_after_first_use_has_no_effect_until_restart():
    script = textwrap.dedent("""
        import json, os
        import torch_neuronx.memory as memory
        os.environ["TORCH_NEURONX_SEGMENT_ALLOCATOR_CONFIG"] = "kRoundupPower2Divisions=1"
        memory.caching_allocator_alloc(1025)
        before = memory.memory_allocated()
        os.environ["TORCH_NEURONX_SEGMENT_ALLOCATOR_CONFIG"] = "kRoundupPower2Divisions=8"
        memory.caching_allocator_alloc(1025)
        memory.caching_allocator_alloc(1025, device="neuron:1")
        print(json.dumps([before, memory.memory_allocated(0), memory.memory_allocated("neuron:1")]))
    """)
    env = dict(os.environ)
    env.pop(ENV, None)
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                         timeout=120, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [2048, 4096, 2048]
