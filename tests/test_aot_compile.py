"""Ahead-of-time compilation: torch's aot_compile path with the neuron backend, torch_neuronx.aot_compile's
input checks, and packages: loaded in a fresh process without tracing or compiling, refused with a
clear error when truncated, corrupt, from another version or target, or given the wrong module."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn as nn

import torch_neuronx
from torch_neuronx.cache import atomic
from torch_neuronx.dynamo import aot, package
from torch_neuronx.dynamo.precompile import NeuronCompiledFn


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10)).eval()


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """The MLP compiled once for a (32, 64) input, its package saved, and the eager reference."""
    model, x = _mlp(), torch.randn(32, 64)
    fn = torch_neuronx.aot_compile(model, (x,))
    path = tmp_path_factory.mktemp("aot") / "mlp.tnxaot"
    fn.save(path)
    with torch.no_grad():
        expected = model(x)
    return model, x, fn, path, expected


def test_aot_compiled_mlp_matches_eager_and_refuses_other_inputs(compiled):
    model, x, fn, _, expected = compiled
    torch.testing.assert_close(fn(x), expected, rtol=1e-5, atol=1e-5)
    assert not fn(x).requires_grad
    strided = x.t().contiguous().t()  # the same shape in other strides: still the right result
    torch.testing.assert_close(fn(strided), expected, rtol=1e-5, atol=1e-5)
    cases = [((torch.randn(16, 64),), {}, r"args\[0\] is a cpu tensor of shape \(16, 64\).*compiled for a cpu "
              r"tensor of shape \(32, 64\)"),
             ((x.double(),), {}, r"args\[0\].*dtype float64.*compiled for .*dtype float32"),
             ((x.to("neuron"),), {}, r"args\[0\] is a neuron:0 tensor.*compiled for a cpu tensor"),
             ((x, x), {}, r"takes 1 positional arguments, got 2"),
             ((x,), {"y": x}, r"takes keyword arguments \[\], got \['y'\]"),
             (([1.0],), {}, r"args\[0\] is a list")]
    for args, kwargs, message in cases:
        with pytest.raises(aot.AOTInputError, match=f"AOT-compiled Sequential.*{message}"):
            fn(*args, **kwargs)


def test_inputs_with_a_negative_bit_are_read_with_their_sign(compiled):
    """``torch._neg_view(x)`` is contiguous memory holding ``-x`` with a bit that says so: the NEFF
    read the memory as is (the bit dropped at the zero-copy import), through aot_compile and
    torch.compile alike; a conjugated complex input stays resolved."""
    model, x, fn, _, _ = compiled
    negative = torch._neg_view(x.clone())
    with torch.no_grad():
        expected = model(negative.resolve_neg())
        torch.testing.assert_close(fn(negative), expected)
        torch.testing.assert_close(torch.compile(model, backend="neuron")(negative), expected)
    z = torch.randn(4, 3, dtype=torch.complex64)
    torch.testing.assert_close(torch.compile(lambda a: a * 2, backend="neuron")(z.conj()), z.conj() * 2)


def test_one_tensor_given_for_several_arguments_serves_distinct_ones():
    """Compiled with one tensor for two arguments (self-attention's ``q, q, q``), the callable
    computed every later call as if the repeats were the first argument (Dynamo made them one
    graph input, guarded by an identity check the callable drops): distinct tensors, the same
    tensor again, and a keyword argument repeating a positional one all give eager's values."""
    def f(a, b, scale=None):
        return a * 2 + b + (0 if scale is None else scale * 3)

    x, y, z = torch.randn(4, 8), torch.randn(4, 8), torch.randn(4, 8)
    fn = torch_neuronx.aot_compile(f, (x, x), {"scale": x})
    torch.testing.assert_close(fn(x, y, scale=z), f(x, y, scale=z))
    torch.testing.assert_close(fn(y, y, scale=y), f(y, y, scale=y))
    torch.manual_seed(0)
    attention = nn.MultiheadAttention(8, 2, batch_first=True).eval()
    q, k, v = torch.randn(2, 5, 8), torch.randn(2, 5, 8), torch.randn(2, 5, 8)
    served = torch_neuronx.aot_compile(attention, (q, q, q), {"need_weights": False})
    with torch.no_grad():
        torch.testing.assert_close(served(q, k, v, need_weights=False)[0], attention(q, k, v, need_weights=False)[0])


def test_parameters_converted_after_compiling_are_refused_not_misread():
    """``model.double()`` after ``aot_compile`` (which skips Dynamo's guards): the float64 weights'
    bytes were bound as float32 (a result off by 1e21, no error); ``half()`` gave IREE's range
    error. Converted back, the callable serves again."""
    model, x = _mlp(), torch.randn(32, 64)
    fn = torch_neuronx.aot_compile(model, (x,))
    fn(x)
    for convert in (model.double, model.half):
        convert()
        with pytest.raises(RuntimeError, match=r"parameter input \d+ is float32 \[128, 64\].*now float"):
            fn(x)
    model.float()
    with torch.no_grad():
        torch.testing.assert_close(fn(x), model(x), rtol=1e-5, atol=1e-5)


def test_a_nan_scalar_compiled_for_is_accepted_and_no_other_float():
    """A callable compiled for the float NaN refused NaN at every call ("is the float nan; it was
    compiled for the float nan"); it serves NaN and still refuses other values."""
    x = torch.randn(3)
    fn = torch_neuronx.aot_compile(lambda t, s: t * s, (x, float("nan")))
    assert fn(x, float("nan")).isnan().all()
    with pytest.raises(aot.AOTInputError, match="args\\[1\\] is the float 1.0"):
        fn(x, 1.0)
    served = torch_neuronx.aot_compile(lambda t, s: t * s, (x, 2.0))
    with pytest.raises(aot.AOTInputError, match="is the float nan"):
        served(x, float("nan"))


def test_scalars_and_keyword_inputs_are_checked():
    def scaled(x: torch.Tensor, *, bias: torch.Tensor, scale: float) -> torch.Tensor:
        return torch.tanh(x * scale + bias)

    x, bias = torch.randn(4, 8), torch.randn(8)
    fn = torch_neuronx.aot_compile(scaled, (x,), {"bias": bias, "scale": 0.5})
    torch.testing.assert_close(fn(x, bias=bias, scale=0.5), scaled(x, bias=bias, scale=0.5))
    with pytest.raises(aot.AOTInputError,
                       match=r"kwargs\['scale'\] is the float 2.0; it was compiled for the float 0.5"):
        fn(x, bias=bias, scale=2.0)  # Dynamo baked 0.5 into the graph: running it would be wrong
    with pytest.raises(aot.AOTInputError, match=r"kwargs\['bias'\] is a cpu tensor of shape \(4,\)"):
        fn(x, bias=torch.randn(4), scale=0.5)
    # an equal number of another type is named too (its message said only "inputs differ")
    half = torch_neuronx.aot_compile(scaled, (x,), {"bias": bias, "scale": 2})
    with pytest.raises(aot.AOTInputError, match=r"kwargs\['scale'\] is the float 2.0; it was compiled for the int 2"):
        half(x, bias=bias, scale=2.0)

    class Sub(torch.Tensor):
        pass

    with pytest.raises(aot.AOTInputError, match=r"args\[0\] is a Sub \(a tensor subclass\)"):
        fn(x.as_subclass(Sub), bias=bias, scale=0.5)  # (it failed deep in the runtime)


class _Head(nn.Module):
    """A user-defined module (PyTorch traces its bound ``__call__``), with a buffer and a dict output."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 4)
        self.register_buffer("shift", torch.ones(4))

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> dict:
        h = self.linear(x) + self.shift
        return {"h": h, "parts": (h.sum(), mask * 2)}


def test_user_module_with_keyword_inputs_round_trips_and_sees_new_weights(tmp_path):
    model, x, mask = _Head().eval(), torch.randn(3, 8), torch.randn(2)
    fn = torch_neuronx.aot_compile(model, (x,), {"mask": mask})
    fn.save(tmp_path / "head.tnxaot")
    loaded = torch_neuronx.aot_load(tmp_path / "head.tnxaot", model)
    with torch.no_grad():
        model.linear.weight.mul_(2)  # in place: the compiled callables read the module's weights
        model.linear.bias = nn.Parameter(torch.randn(4))  # replaced by one of the same shape
        expected = model(x, mask=mask)
    for f in (fn, loaded):
        out = f(x, mask=mask)
        torch.testing.assert_close(out["h"], expected["h"], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(out["parts"][1], expected["parts"][1])


def test_torch_aot_compile_path_serializes_the_neuron_result(compiled):
    model, x, _, _, expected = compiled
    from torch._dynamo.aot_compile import AOTCompiledFunction

    with torch.no_grad():
        fn = torch.compile(model, backend="neuron", fullgraph=True).forward.aot_compile(((x,), {}))
    assert isinstance(fn._artifacts.compiled_fn, NeuronCompiledFn)
    data = AOTCompiledFunction.serialize(fn, {"model": model}).serialized_data
    restored = AOTCompiledFunction.deserialize(data, external_closure_data={"model": model})
    restored.disable_guard_check()
    torch.testing.assert_close(restored(x), expected, rtol=1e-5, atol=1e-5)


def test_torch_aot_compile_path_of_a_second_shape_runs_and_says_why_it_cannot_be_saved():
    """A second batch size through torch's path gets a graph with dynamic sizes (Dynamo's automatic
    dynamic shapes), compiled at its calls: torch refused the backend's result with a raw
    "does not implement SerializableCallable"; it runs, and saving it names the way out."""
    from torch._dynamo.aot_compile import AOTCompiledFunction

    model = _mlp()
    torch._dynamo.reset()
    with torch.no_grad():
        for batch in (4, 8):
            x = torch.randn(batch, 64)
            fn = torch.compile(model, backend="neuron", fullgraph=True).forward.aot_compile(((x,), {}))
            torch.testing.assert_close(fn(x), model(x), rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeError, match="dynamic=False"):
        AOTCompiledFunction.serialize(fn, {"model": model})


_SERVE = """
import sys, torch, torch.nn as nn
import torch_neuronx
from torch_neuronx.compiler import driver

def refuse(*args, **kwargs):
    raise AssertionError("compiled or traced while loading a package")

driver.compile_neff = refuse
torch._dynamo.convert_frame.fullgraph_capture = refuse
torch._dynamo.convert_frame.convert_frame_assert = refuse
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10)).eval()
x, expected = torch.load(sys.argv[2])
fn = torch_neuronx.aot_load(sys.argv[1], model)
torch.testing.assert_close(fn(x), expected, rtol=1e-5, atol=1e-5)
print("SERVED", torch._dynamo.utils.counters["stats"]["unique_graphs"])
"""


@pytest.mark.parametrize("resident", ["1", "0"])
def test_package_serves_in_a_fresh_process_without_tracing_or_compiling(compiled, tmp_path, resident):
    """The package holds the NEFF with resident parameters and the one taking them as arguments:
    a server with TORCH_NEURONX_RESIDENT_PARAMETERS=0 compiled the graph again."""
    _, x, _, path, expected = compiled
    torch.save((x, expected), tmp_path / "io.pt")
    env = {**os.environ, **{name: str(tmp_path / name.lower()) for name in (
        "TORCH_NEURONX_NEFF_CACHE_DIR", "TORCH_NEURONX_HLO_CACHE_DIR", "TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR",
        "TORCHINDUCTOR_CACHE_DIR")}, "TORCH_NEURONX_RESIDENT_PARAMETERS": resident}  # empty caches
    out = subprocess.run([sys.executable, "-c", _SERVE, str(path), str(tmp_path / "io.pt")], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "SERVED 0" in out.stdout


_UNPICKLE = _SERVE.split("torch.manual_seed(0)")[0] + """
import pickle
fn, x, expected = pickle.load(open(sys.argv[1], "rb"))
torch.testing.assert_close(fn(x), expected, rtol=1e-5, atol=1e-5)
print("SERVED", torch._dynamo.utils.counters["stats"]["unique_graphs"])
"""


def test_pickled_callable_serves_in_a_fresh_process_and_deepcopies(compiled, tmp_path):
    """An AOT callable pickles as its package and its module (a multiprocessing worker or a
    cache of callables gets it without tracing or compiling); it raised "cannot pickle
    RootGuardManager". copy.deepcopy gives an independent callable over a copied module."""
    import copy
    import pickle
    model, x, fn, _, expected = compiled
    (tmp_path / "fn.pkl").write_bytes(pickle.dumps((fn, x, expected)))
    env = {**os.environ, **{name: str(tmp_path / name.lower()) for name in (
        "TORCH_NEURONX_NEFF_CACHE_DIR", "TORCH_NEURONX_HLO_CACHE_DIR", "TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR",
        "TORCHINDUCTOR_CACHE_DIR")}}
    out = subprocess.run([sys.executable, "-c", _UNPICKLE, str(tmp_path / "fn.pkl")], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "SERVED 0" in out.stdout
    twin = copy.deepcopy(fn)
    torch.testing.assert_close(twin(x), expected, rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        twin._model[0].weight.zero_()  # the copy's module, not the original's
    torch.testing.assert_close(fn(x), expected, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(twin(x), expected)
    def scale(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a * 2 + b
    g = pickle.loads(pickle.dumps(torch_neuronx.aot_compile(scale, (x, x))))
    torch.testing.assert_close(g(x, x), x * 2 + x)
    broken = bytearray(pickle.dumps(fn))
    at = broken.index(package.MAGIC) + 4096
    broken[at] ^= 0xFF
    with pytest.raises(package.PackageError, match="<pickled Sequential>.*(checksum|corrupt)"):
        pickle.loads(bytes(broken))


def test_dimensions_marked_dynamic_are_a_clear_error():
    """aot_compile serves static shapes: a mark_dynamic example input gave the generic
    "does not compile to a graph that runs from a plan" error."""
    x = torch.randn(3, 8)
    torch._dynamo.mark_dynamic(x, 0)
    with pytest.raises(aot.AOTCompileError, match=r"args\[0\] has dimension\(s\) \[0\] marked dynamic.*"
                                                   r"dynamic=True"):
        torch_neuronx.aot_compile(nn.Linear(8, 4).eval(), (x,))


def _rewrite(path, target, edit) -> None:
    """Copy the package at ``path`` to ``target`` with its header changed by ``edit``."""
    header, sections = package.read(path)
    del header["sections"]
    edit(header)
    package.write(target, sections, header)


def test_bad_packages_are_clear_errors(compiled, tmp_path):
    model, _, _, path, _ = compiled
    data = path.read_bytes()
    bad = tmp_path / "bad.tnxaot"
    bad.write_bytes(data[: len(data) // 2])
    with pytest.raises(package.PackageError,
                       match=rf"{bad} is truncated: section 'dynamo' ends at byte [0-9]+, the file has [0-9]+"):
        torch_neuronx.aot_load(bad, model)
    bad.write_bytes(data[:20])
    with pytest.raises(package.PackageError, match=r"truncated inside its header"):
        torch_neuronx.aot_load(bad, model)
    corrupt = bytearray(data)
    corrupt[-100] ^= 0xFF  # inside the last section (the NEFF)
    bad.write_bytes(bytes(corrupt))
    with pytest.raises(package.PackageError, match=r"section 'neff/[0-9a-f]+' fails its checksum"):
        torch_neuronx.aot_load(bad, model)
    edited = data.replace(b'{"bound": false', b'{"bound":  true', 1)  # the header's first field
    assert edited != data and len(edited) == len(data)
    bad.write_bytes(edited)  # a header edited by hand (same length): refused, never half-read
    with pytest.raises(package.PackageError, match=r"its header fails its checksum"):
        torch_neuronx.aot_load(bad, model)
    bad.write_bytes(b"PK\x03\x04" + data[4:])
    with pytest.raises(package.PackageError, match=r"not a torch_neuronx AOT package"):
        torch_neuronx.aot_load(bad, model)

    _rewrite(path, bad, lambda h: h["environment"].update(torch_neuronx="0.0.1"))
    with pytest.raises(package.PackageError, match=r"(?s)another version or target.*torch_neuronx: package '0.0.1'"):
        torch_neuronx.aot_load(bad, model)
    _rewrite(path, bad, lambda h: h["environment"]["compiler_config"].update(target="trn2"))
    with pytest.raises(package.PackageError, match=r"(?s)another version or target.*compiler_config: package "
                                                   r"\{[^}]*'target': 'trn2'"):
        torch_neuronx.aot_load(bad, model)

    with pytest.raises(package.PackageError, match=r"holds the compiled Sequential module: pass the module"):
        torch_neuronx.aot_load(path)
    other = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10))
    with pytest.raises(package.PackageError, match=r"(?s)parameters differ.*0.weight: compiled \[\[128, 64\], "
                                                   r"'float32', 'cpu'\], given \[\[256, 64\], 'float32', 'cpu'\]"):
        torch_neuronx.aot_load(path, other)
    # A module moved to the device after compiling: refused at load, naming the device (its first call
    # failed with "NEFF inputs must be plain CPU tensors", naming no parameter).
    on_device = copy.deepcopy(model).to("neuron")
    with pytest.raises(package.PackageError, match=r"(?s)parameters differ.*device.*0.weight: compiled \[\[128, 64\], "
                                                   r"'float32', 'cpu'\], given \[\[128, 64\], 'float32', 'neuron'\]"):
        torch_neuronx.aot_load(path, on_device)


def test_save_is_atomic(compiled, tmp_path, monkeypatch):
    _, x, fn, path, _ = compiled
    target = tmp_path / "mlp.tnxaot"
    target.write_bytes(path.read_bytes())
    before = target.read_bytes()

    def killed(temp: str, final: str) -> None:
        raise OSError("writer killed before the rename")

    monkeypatch.setattr(atomic, "before_rename_hook", killed)
    with pytest.raises(OSError, match="killed"):
        fn.save(target)
    assert target.read_bytes() == before  # the previous package, whole
    assert os.listdir(tmp_path) == ["mlp.tnxaot"]  # no temporary file left behind
    header, _ = package.read(target)
    assert json.loads(json.dumps(header["inputs"])) == {"args": [["tensor", [32, 64], "float32", "cpu"]],
                                                        "kwargs": {}}


class _TiedLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb, self.head = nn.Embedding(50, 16), nn.Linear(16, 50, bias=False)
        self.head.weight = self.emb.weight  # tied, as GPT-2's

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.emb(ids)))


def test_untying_weights_after_compiling_is_refused_not_computed_with_the_old_tie(tmp_path):
    """An AOT callable of a model with tied weights, called after the head was given a parameter
    of its own, computed with the tied one (15.6 off eager, no error); a package saved after
    untying recorded the untied names and its load accepted an untied module."""
    torch.manual_seed(0)
    model, ids = _TiedLM().eval(), torch.randint(0, 50, (2, 12))
    fn = torch_neuronx.aot_compile(model, (ids,))
    with torch.no_grad():
        torch.testing.assert_close(fn(ids), model(ids))
    model.head.weight = nn.Parameter(torch.randn(50, 16))
    with pytest.raises(aot.AOTInputError, match=r"head.weight and emb.weight were one tensor"):
        fn(ids)
    fn.save(tmp_path / "tied.tnxaot")  # saved after untying: the package still says tied
    with pytest.raises(package.PackageError, match=r"head.weight: compiled None"):
        torch_neuronx.aot_load(tmp_path / "tied.tnxaot", model)
    loaded = torch_neuronx.aot_load(tmp_path / "tied.tnxaot", _TiedLM().eval())
    assert loaded(ids).shape == (2, 12, 50)


def test_a_loaded_callable_serves_inside_a_compiled_function(compiled):
    """A serving wrapper compiled around a loaded (or unpickled) AOT callable failed in Dynamo
    ("InternalTorchDynamoError: KeyError: __builtins__"); it runs between the wrapper's graphs."""
    model, x, _, path, expected = compiled
    loaded = torch_neuronx.aot_load(path, model)
    for backend in ("eager", "neuron"):
        torch._dynamo.reset()
        wrapper = torch.compile(lambda t: loaded(t * 1.0) * 2 + 1, backend=backend)
        torch.testing.assert_close(wrapper(x), expected * 2 + 1)
    torch._dynamo.reset()


def test_save_writes_where_asked_or_says_why_not(compiled, tmp_path, monkeypatch):
    """``fn.save("model.tnxaot")`` (a bare name, the docs' own example) raised FileNotFoundError
    for ''; a symbolic link was replaced by a file (its target never written), a device node or
    other non-regular file was replaced too, and errors named a hidden temporary file."""
    _, x, fn, path, _ = compiled
    monkeypatch.chdir(tmp_path)
    fn.save("bare.tnxaot")
    assert (tmp_path / "bare.tnxaot").read_bytes() == path.read_bytes()
    (tmp_path / "real").mkdir()
    os.symlink(tmp_path / "real" / "model.tnxaot", tmp_path / "link.tnxaot")
    fn.save(tmp_path / "link.tnxaot")
    assert os.path.islink(tmp_path / "link.tnxaot")
    assert (tmp_path / "real" / "model.tnxaot").read_bytes() == path.read_bytes()
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(package.PackageSaveError, match=r"pipe: it exists and is not a regular file"):
        fn.save(tmp_path / "pipe")
    (tmp_path / "file").write_text("")
    with pytest.raises(package.PackageSaveError, match=r"cannot write AOT package .*file/under\.tnxaot: ") as caught:
        fn.save(tmp_path / "file" / "under.tnxaot")  # a directory that is a file
    assert isinstance(caught.value, OSError) and ".tmp" not in str(caught.value)


def test_graphs_not_served_by_a_plan_are_refused():
    def mutating(x: torch.Tensor) -> torch.Tensor:
        x.add_(1)  # an input mutated in place needs aot_autograd's wrapper
        return x * 2

    def viewing(x: torch.Tensor) -> torch.Tensor:
        return (x * 2).view(-1), x.t()  # an output that is a view of an input

    for fn in (mutating, viewing):
        with pytest.raises(aot.AOTCompileError,
                           match=rf"{fn.__name__} does not compile to a graph that runs from a plan"):
            torch_neuronx.aot_compile(fn, (torch.randn(4, 4),))


def test_a_model_whose_guards_torch_cannot_serialize_is_a_clear_error():
    """Hugging Face models need ID_MATCH guards, which torch 2.13's aot_compile cannot serialize
    (for every backend): an AOTCompileError that says so and points at torch.compile, not
    torch's bare PackageError."""
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=100, eos_token_id=0, bos_token_id=0)
    model = transformers.GPT2Model(config).eval()
    model.config.return_dict = False
    with pytest.raises(aot.AOTCompileError, match="cannot serialize.*torch.compile instead"):
        torch_neuronx.aot_compile(model, (torch.randint(0, 100, (2, 8)),))
