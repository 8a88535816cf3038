"""The instrumentation layer: events, spans, counters and listeners, and the points every call passes."""

from __future__ import annotations

import collections
import os
import threading

import pytest
import torch

import torch_neuronx  # noqa: F401  (registers the neuron device)
from torch_neuronx import metrics, observe
from torch_neuronx.observe import events, names
from torch_neuronx.runtime import streams

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_nothing_listens_by_default_and_spans_are_free():
    assert not observe.state.active
    assert observe.span("pipeline.lower") is observe.span("runtime.launch")  # one shared no-op context
    observe.emit("memory.malloc", 8)  # returns at once; no listener to reach


def test_listeners_get_events_spans_and_counts_with_their_fields():
    seen: list[observe.Event] = []
    with observe.listening(seen.append):
        assert observe.state.active
        observe.emit("transfer.host_to_device", 64, device=1)
        with observe.span("pipeline.lower", graph="g"):
            pass
        observe.count("compiled_graphs", 2)
    assert not observe.state.active
    by_name = {e.name: e for e in seen}
    assert by_name["transfer.host_to_device"].value == 64
    assert by_name["transfer.host_to_device"].fields == {"device": 1}
    assert by_name["pipeline.lower"].kind == "span" and by_name["pipeline.lower"].duration_ns >= 0
    assert by_name["compiled_graphs"].kind == "count" and by_name["compiled_graphs"].value == 2
    assert all(e.thread == threading.get_ident() for e in seen)


def test_a_span_left_by_an_exception_carries_it():
    seen: list[observe.Event] = []
    with observe.listening(seen.append), pytest.raises(ValueError), observe.span("pipeline.trace"):
        raise ValueError("boom")
    assert seen[0].fields["error"] == "ValueError: boom"


def test_unregistered_names_are_refused():
    with pytest.raises(observe.UnknownMetricError):
        observe.count("compiled_grahps")  # a typo never makes a new metric
    with observe.listening(lambda e: None), pytest.raises(observe.UnknownMetricError):
        observe.emit("no.such.event")


def test_a_failing_listener_never_fails_the_program(caplog):
    def broken(event):
        raise RuntimeError("listener bug")

    seen = []
    with observe.listening(broken), observe.listening(seen.append):
        observe.count("kernel_traces")
    assert [e.name for e in seen] == ["kernel_traces"]
    assert "listener bug" in caplog.text


def test_metrics_facade_reads_the_same_counters():
    before = metrics.counter("warm_start_plans")
    observe.count("warm_start_plans")
    metrics.increment("warm_start_plans")
    assert metrics.counter("warm_start_plans") == observe.counter("warm_start_plans") == before + 2
    assert metrics.counters()["warm_start_plans"] == before + 2


def test_every_registered_name_has_kind_unit_and_doc():
    entries = names.metrics()
    assert len({m.name for m in entries}) == len(entries)
    for m in entries:
        assert m.kind in names.KINDS and m.unit and m.doc.endswith(".") and m.section, m


def test_metrics_doc_is_generated_from_the_registry():
    with open(os.path.join(ROOT, "docs", "metrics.md")) as f:
        assert f.read() == names.render_markdown() + "\n", "docs/metrics.md is stale: run `make docs`"


def _kinds(seen):
    return collections.Counter(e.name for e in seen)


def test_eager_ops_and_compiled_graphs_report_every_stage(tmp_path, monkeypatch):
    # A fresh cache: the op and the graph compile here, so every stage runs.
    monkeypatch.setenv("TORCH_NEURONX_NEFF_CACHE_DIR", str(tmp_path / "neff"))
    monkeypatch.setenv("TORCH_NEURONX_HLO_CACHE_DIR", str(tmp_path / "hlo"))
    seen: list[observe.Event] = []
    with observe.listening(seen.append):
        x = torch.arange(6, dtype=torch.float32, device="neuron")
        y = (x * 3 - 1).cpu()
        compiled = torch.compile(lambda a: torch.cos(a) * 3 + 0.5, backend="neuron")
        z = compiled(torch.arange(5, dtype=torch.float32) + 0.125)
        streams.default_stream(0).submit(lambda: None)
        streams.synchronize(0)
    torch.testing.assert_close(y, torch.arange(6, dtype=torch.float32) * 3 - 1)
    torch.testing.assert_close(z, torch.cos(torch.arange(5) + 0.125) * 3 + 0.5)
    kinds = _kinds(seen)
    for stage in ("pipeline.trace", "pipeline.fx_passes", "pipeline.lower", "pipeline.neff", "compiler.compile",
                  "runtime.load", "runtime.launch", "cache.get", "cache.put", "cache.lock_wait",
                  "memory.malloc", "transfer.host_to_device", "transfer.device_to_host", "stream.submit",
                  "compiled_graphs", "eager_ops_compiled", "compiler_invocations", "neff_cache.misses"):
        assert kinds[stage] >= 1, (stage, kinds)
    launches = [e for e in seen if e.name == "runtime.launch"]
    assert len(launches) >= 2 and all(e.duration_ns > 0 for e in launches)
    transfers = [e for e in seen if e.name == "transfer.device_to_host"]
    assert transfers[0].value == 6 * 4


def test_frees_are_reported():
    seen: list[observe.Event] = []
    x = torch.empty(1000, device="neuron")
    with observe.listening(seen.append):
        del x
    assert [e.name for e in seen] == ["memory.free"]


def test_no_listener_means_no_event_objects(monkeypatch):
    made = []
    real = events.Event

    def counting(*args, **kwargs):
        made.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(events, "Event", counting)
    x = torch.ones(4, device="neuron")
    (x + 1).cpu()
    assert made == []
