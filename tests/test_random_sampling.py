"""Samplers under torch.compile(backend="neuron"): fresh draws every call, torch's distributions."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F


def _twice(fn, *args):
    compiled = torch.compile(fn, backend="neuron")
    return compiled(*args), compiled(*args)


def test_samplers_draw_fresh_values_with_torchs_distributions():
    torch.manual_seed(0)
    p = torch.rand(64, 256)

    def fn(p):
        return (torch.bernoulli(p), torch.bernoulli(p, 0.25), torch.empty_like(p).normal_(2.0, 0.5),
                torch.empty_like(p).uniform_(-1.0, 3.0), torch.empty_like(p).exponential_(4.0))

    first, second = _twice(fn, p)
    for a, b in zip(first, second, strict=True):
        assert a.shape == p.shape and not torch.equal(a, b), "the same values on two calls"
    bernoulli, fixed, normal, uniform, exponential = first
    assert set(bernoulli.unique().tolist()) <= {0.0, 1.0}
    assert abs((bernoulli - p).mean()) < 0.01  # E[bernoulli(p)] = p
    assert abs(fixed.mean() - 0.25) < 0.01
    assert abs(normal.mean() - 2.0) < 0.01 and abs(normal.std() - 0.5) < 0.01
    assert uniform.min() >= -1.0 and uniform.max() < 3.0 and abs(uniform.mean() - 1.0) < 0.02
    assert exponential.min() >= 0 and abs(exponential.mean() - 0.25) < 0.01


def test_multinomial_with_and_without_replacement():
    torch.manual_seed(1)
    weights = torch.tensor([[1.0, 0.0, 3.0, 4.0, 2.0]]).expand(4000, 5).contiguous()

    def fn(w):
        return torch.multinomial(w, 3), torch.multinomial(w, 6, replacement=True), torch.multinomial(w, 1)

    (without, with_, one), (again, _, _) = _twice(fn, weights)
    # one sample without replacement (a language model's next token): the largest Gumbel key
    assert one.shape == (4000, 1) and one.dtype == torch.int64
    share = torch.bincount(one.reshape(-1), minlength=5).float() / 4000
    torch.testing.assert_close(share, weights[0] / weights[0].sum(), atol=0.03, rtol=0)
    assert not torch.equal(without, again)
    assert without.dtype == torch.int64 and without.shape == (4000, 3)
    assert (without != 1).all()  # zero weight: never drawn
    assert (without.sort(1).values.diff(dim=1) != 0).all()  # no repeats within a row
    share = torch.bincount(without[:, 0], minlength=5).float() / 4000
    torch.testing.assert_close(share, weights[0] / weights[0].sum(), atol=0.03, rtol=0)
    share = torch.bincount(with_.reshape(-1), minlength=5).float() / with_.numel()
    torch.testing.assert_close(share, weights[0] / weights[0].sum(), atol=0.02, rtol=0)


def test_channel_dropout_and_stochastic_depth_change_masks_per_call():
    torch.manual_seed(2)
    x = torch.ones(8, 16, 4, 4)

    def fn(x):
        keep = torch.empty(x.shape[0], 1, 1, 1).bernoulli_(0.5)  # stochastic depth
        return F.dropout2d(x, 0.5, training=True), x * keep / 0.5

    (channels, depth), (channels2, depth2) = _twice(fn, x)
    assert not torch.equal(channels, channels2) and not torch.equal(depth, depth2)
    per_channel = channels.reshape(8, 16, 16)
    # whole channels are dropped or scaled by 1 / (1 - p)
    assert ((per_channel == 0).all(-1) | (per_channel == 2.0).all(-1)).all()
    assert set(depth.reshape(8, -1)[:, 0].tolist()) <= {0.0, 2.0}


@pytest.mark.parametrize("weights, message", [
    ([[0.5, -0.1, 0.6]], "element < 0"),
    ([[0.5, float("nan"), 0.6]], "element < 0"),
    ([[0.5, float("inf"), 0.6]], "element < 0"),
    ([[0.0, 0.0, 0.0]], "sum of probabilities"),
])
def test_compiled_multinomial_checks_its_weights_as_eager_does(weights, message):
    """A negative, infinite or NaN weight, or a row of zeros, raises torch's error (it drew a sample)."""
    probs = torch.tensor(weights)
    with pytest.raises(RuntimeError, match=message):
        torch.multinomial(probs, 1)
    compiled = torch.compile(lambda p: torch.multinomial(p, 1, replacement=True), backend="neuron", dynamic=False)
    with pytest.raises(RuntimeError, match=message):
        compiled(probs)
    assert compiled(torch.tensor([[0.0, 1.0, 0.0]])).item() == 1


def test_normal_of_tensors_draws_fresh_values_with_the_given_moments():
    """``torch.normal(mean, std)`` with a tensor mean, std or both (the reparameterization of a VAE,
    a diffusion step's noise) compiles, draws anew per call, and broadcasts as eager."""
    def f(mean, std):
        return torch.normal(mean, 2.0), torch.normal(mean, std), torch.normal(1.0, std), torch.normal(mean[:1], std)

    mean = torch.linspace(-3, 3, 4).repeat_interleave(20000).reshape(4, 20000)
    std = torch.full((4, 20000), 0.5)
    compiled = torch.compile(f, backend="neuron")
    first, second = compiled(mean, std), compiled(mean, std)
    for got, expected in zip(first, f(mean, std)):
        assert got.shape == expected.shape and got.dtype == expected.dtype
        torch.testing.assert_close(got.mean(1), expected.mean(1), atol=0.05, rtol=0)
        torch.testing.assert_close(got.std(1), expected.std(1), atol=0.05, rtol=0)
    assert not any(torch.equal(a, b) for a, b in zip(first, second))


@pytest.mark.parametrize("reentrant", [False, True])
def test_checkpointed_dropout_compiles_and_its_backward_sees_the_forwards_mask(reentrant):
    """``torch.utils.checkpoint`` around dropout: aot_autograd replays the generator for the
    recompute with higher-order ops torch-mlir cannot import (every such graph failed); the
    draws are saved instead, so the gradient follows the very mask the forward used."""
    from torch.utils.checkpoint import checkpoint

    def f(x, w):
        return checkpoint(lambda t: F.dropout(torch.tanh(t @ w), 0.5, training=True), x, use_reentrant=reentrant)

    torch._dynamo.reset()
    compiled = torch.compile(f, backend="neuron")
    x = torch.randn(16, 8, requires_grad=True)
    w = torch.randn(8, 8, requires_grad=True)
    masks = []
    for _ in range(2):
        y = compiled(x, w)
        mask = (y != 0).float()
        grad_x, grad_w = torch.autograd.grad(y.sum(), (x, w))
        hidden = x.detach() @ w.detach()
        upstream = mask * 2 * (1 - torch.tanh(hidden) ** 2)  # dropout's scale, tanh's derivative
        torch.testing.assert_close(y, torch.tanh(hidden) * mask * 2)
        torch.testing.assert_close(grad_x, upstream @ w.detach().T)
        torch.testing.assert_close(grad_w, x.detach().T @ upstream)
        masks.append(mask)
    assert not torch.equal(masks[0], masks[1])  # a fresh mask per call


def test_a_neuron_generator_draws_the_sequence_of_a_cpu_generator_with_its_seed():
    """``torch.Generator(device="neuron")`` (torch's own constructor has no hook for it): the
    draws of every random op given it match a CPU generator's from the same seed; it reports its
    device, copies and pickles as a neuron generator, and every generator is still a
    ``torch.Generator``."""
    import copy
    import pickle

    made = torch.Generator(device="neuron")
    assert made.device == torch.device("neuron", 0) and made.initial_seed() == torch.Generator().initial_seed()
    assert isinstance(made, torch.Generator) and isinstance(torch.default_generator, torch.Generator)
    assert torch.Generator("cpu").device == torch.device("cpu")
    draws = {
        "randn": lambda g, d: torch.randn(3, 4, generator=g, device=d),
        "randint": lambda g, d: torch.randint(0, 100, (6,), generator=g, device=d),
        "randperm": lambda g, d: torch.randperm(7, generator=g, device=d),
        "normal_": lambda g, d: torch.empty(5, device=d).normal_(2.0, 3.0, generator=g),
        "bernoulli": lambda g, d: torch.bernoulli(torch.full((8,), 0.5, device=d), generator=g),
        "multinomial": lambda g, d: torch.multinomial(torch.ones(10, device=d), 4, generator=g),
    }
    for name, draw in draws.items():
        neuron = draw(torch.Generator(device="neuron:0").manual_seed(7), "neuron")
        host = draw(torch.Generator().manual_seed(7), "cpu")
        assert neuron.device.type == "neuron" and torch.equal(neuron.cpu(), host), name
    made.manual_seed(3)
    torch.randn(2, generator=made, device="neuron")
    for again in (copy.deepcopy(made), pickle.loads(pickle.dumps(made))):
        assert again.device == made.device and torch.equal(again.get_state(), made.get_state())
    with pytest.raises(RuntimeError, match="neuron device 5 does not exist"):
        torch.Generator(device="neuron:5")


def test_compiled_functions_take_and_make_neuron_generators_as_eager_code_does():
    """Dynamo graph-breaks on a CPU generator; a neuron one (a subclass) failed every compiled
    function given or making one ("FakeScriptObject"). Now the draws are eager's, in order."""
    def given(x, g):
        return x * 2 + torch.randn(x.shape, generator=g, device=x.device)

    def making(x):
        g = torch.Generator(device="neuron")
        g.manual_seed(7)
        return torch.rand(x.shape, generator=g, device=x.device) + x

    x = torch.ones(5, device="neuron")
    compiled_given = torch.compile(given, backend="neuron")
    g, reference = torch.Generator(device="neuron").manual_seed(3), torch.Generator(device="neuron").manual_seed(3)
    for _ in range(2):  # the generator's state advances call after call
        assert torch.equal(compiled_given(x, g).cpu(), given(x, reference).cpu())
    assert torch.equal(torch.compile(making, backend="neuron")(x).cpu(), making(x).cpu())


@pytest.mark.parametrize("training", [False, True])
def test_compiled_random_ops_on_neuron_draw_from_the_devices_generator(training):
    """A compiled graph's random ops on neuron tensors (a factory placed there too) draw from the
    neuron device's generator, as the eager device's do: ``torch.neuron.manual_seed`` and its RNG
    state replay them, and the host's generator is left alone (they drew from it: the seeds did
    not apply, and a compiled draw repeated the next eager one). A graph of host tensors draws
    from the host's generator."""
    torch._dynamo.reset()
    w = torch.randn(8, 8, device="neuron", requires_grad=training)

    def f(x, w):
        return F.dropout(x @ w, 0.5, training=True) + torch.randn_like(x) + torch.rand(8, device="neuron")

    compiled = torch.compile(f, backend="neuron")
    x = torch.ones(4, 8, device="neuron")
    compiled(x, w)
    torch.neuron.manual_seed(5)
    first = compiled(x, w).detach().cpu()
    torch.neuron.manual_seed(5)
    assert torch.equal(compiled(x, w).detach().cpu(), first)
    state = torch.neuron.get_rng_state()
    again = compiled(x, w).detach().cpu()
    assert not torch.equal(again, first)
    torch.neuron.set_rng_state(state)
    assert torch.equal(compiled(x, w).detach().cpu(), again)
    host, device = torch.get_rng_state(), torch.neuron.get_rng_state()
    compiled(x, w)
    assert torch.equal(torch.get_rng_state(), host) and not torch.equal(torch.neuron.get_rng_state(), device)

    on_host = torch.compile(lambda t: torch.rand_like(t), backend="neuron")
    t = torch.ones(3)
    on_host(t)
    torch.manual_seed(1)
    device = torch.neuron.get_rng_state()
    drawn = on_host(t)
    assert torch.equal(torch.neuron.get_rng_state(), device)
    torch.manual_seed(1)
    assert torch.equal(drawn, torch.rand(3))


@pytest.mark.parametrize("device", ["cpu", "neuron"])
def test_samplers_without_a_lowering_draw_in_compiled_graphs(device):
    """``poisson``, gamma, binomial and Dirichlet samples (``Beta(a, b).sample()``, mixup's) draw from
    their tensors' values, which no lowering computes: they run between the compiled partitions
    (from the neuron device's generator for neuron tensors); ``log_normal_``, ``cauchy_`` and
    ``geometric_`` only fill their tensor: graph inputs drawn per call. Every one failed to lower."""
    torch._dynamo.reset()
    rates = torch.full((4096,), 3.0, device=device)

    def fn(rates):
        beta = torch.distributions.Beta(rates[:2] * 0 + 2.0, rates[:2] * 0 + 2.0).sample((2048,))
        return (torch.poisson(rates * 2), torch._standard_gamma(rates), torch.binomial(rates * 4, rates / 6),
                beta, torch.empty_like(rates).log_normal_(0.0, 0.25), torch.empty_like(rates).cauchy_(),
                torch.empty_like(rates).geometric_(0.5))

    compiled = torch.compile(fn, backend="neuron")
    first, second = compiled(rates), compiled(rates)
    for a, b in zip(first, second, strict=True):
        assert a.device.type == device and not torch.equal(a.cpu(), b.cpu()), "the same values on two calls"
    poisson, gamma, binomial, beta, log_normal, cauchy, geometric = (t.cpu() for t in first)
    assert abs(poisson.mean() - 6.0) < 0.2 and torch.equal(poisson, poisson.round())
    assert abs(gamma.mean() - 3.0) < 0.15 and (gamma > 0).all()
    assert abs(binomial.mean() - 6.0) < 0.2 and binomial.max() <= 12
    assert beta.shape == (2048, 2) and abs(beta.mean() - 0.5) < 0.02 and ((beta > 0) & (beta < 1)).all()
    assert abs(log_normal.log().mean()) < 0.02 and abs(log_normal.log().std() - 0.25) < 0.02
    assert abs(cauchy.median()) < 0.1 and abs(geometric.mean() - 2.0) < 0.1 and geometric.min() >= 1
    if device == "neuron":  # the device's generator: its seed replays them
        torch.neuron.manual_seed(3)
        again = compiled(rates)
        torch.neuron.manual_seed(3)
        for a, b in zip(again, compiled(rates), strict=True):
            assert torch.equal(a.cpu(), b.cpu())


def test_compiled_bernoulli_of_a_probability_out_of_range_raises_torchs_error():
    """Traced, ``bernoulli(x, p=1.5)`` and ``x.bernoulli_(-0.5)`` drew anyway (eager raises)."""
    x = torch.rand(8)
    for fn in (lambda t: torch.bernoulli(t, 1.5), lambda t: t.clone().bernoulli_(-0.5)):
        with pytest.raises(Exception, match=r"expects p to be in \[0, 1\]"):
            torch.compile(fn, backend="neuron")(x)


def test_half_precision_samplers_draw_float32_uniforms():
    """Compiled samplers of float16/bfloat16 tensors drew their uniforms in that dtype: 8 bits of
    bfloat16 made ``dropout(p=0.001)`` drop nothing, ``bernoulli(0.001)`` fire 3x too often and
    ``exponential_`` stop at 5.5 (torch draws in float32: about 14 in a million draws)."""
    torch.manual_seed(0)
    n = 1 << 20
    ones = torch.ones(n, dtype=torch.bfloat16)

    def fn(x):
        return (F.dropout(x, 0.001), torch.bernoulli(torch.full_like(x, 0.001)), torch.empty_like(x).exponential_(),
                torch.bernoulli(torch.full_like(x.half(), 0.001)))

    dropped, fired, exponential, fired_half = torch.compile(fn, backend="neuron")(ones)
    sd = (0.001 * 0.999 / n) ** 0.5
    assert abs((dropped == 0).float().mean().item() - 0.001) < 5 * sd
    assert abs(fired.float().mean().item() - 0.001) < 5 * sd
    assert abs(fired_half.float().mean().item() - 0.001) < 5 * sd
    assert exponential.float().max() > 9 and abs(exponential.float().mean().item() - 1) < 0.01


def test_compiled_rrelu_draws_fresh_slopes_and_its_backward_uses_them():
    """``F.rrelu(training=True)`` compiled used the same 'random' slopes on every call and seed."""
    x = -torch.rand(4096) - 0.5
    x[:10] = torch.arange(10.0)  # positives pass through

    def fn(t):
        return F.rrelu(t, 0.1, 0.3, training=True)

    compiled = torch.compile(fn, backend="neuron")
    a, b = compiled(x), compiled(x)
    assert not torch.equal(a, b)
    for out in (a, b):
        slopes = out[10:] / x[10:]
        assert torch.equal(out[:10], x[:10])
        assert slopes.min() >= 0.1 and slopes.max() <= 0.3 and abs(slopes.mean() - 0.2) < 0.005
    leaf = x.clone().requires_grad_()
    out = compiled(leaf)
    out.sum().backward()
    torch.testing.assert_close(leaf.grad[10:], (out / x)[10:].detach())
    torch.testing.assert_close(torch.compile(lambda t: F.rrelu(t, 0.1, 0.3), backend="neuron")(x), F.rrelu(x, 0.1, 0.3))


def test_ops_without_a_lowering_run_on_the_host_between_compiled_partitions():
    """Fractional max pooling and the gradients of gamma and Dirichlet samples (``Beta.rsample()``
    in a loss) failed to lower: they run as they are, the compute around them compiled."""
    torch.manual_seed(0)
    x, samples = torch.randn(2, 3, 9, 7), torch.rand(2, 3, 2)
    alpha, draws = torch.rand(64) * 3 + 0.1, torch.rand(64) + 0.01

    def fn(x, samples, alpha, draws):
        pooled, indices = F.fractional_max_pool2d(x * 2, 2, output_size=(4, 3), return_indices=True,
                                                  _random_samples=samples)
        return (pooled.relu(), indices, torch._standard_gamma_grad(draws, alpha) + 1,
                torch._dirichlet_grad(draws, alpha, alpha.sum().expand(64)))

    leaf = x.clone().requires_grad_()
    got = torch.compile(fn, backend="neuron")(leaf, samples, alpha, draws)
    expected_leaf = x.clone().requires_grad_()
    expected = fn(expected_leaf, samples, alpha, draws)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b)
    got[0].sum().backward()
    expected[0].sum().backward()
    torch.testing.assert_close(leaf.grad, expected_leaf.grad)
    concentration = torch.tensor([0.5, 1.0, 3.0], requires_grad=True)
    loss = torch.compile(lambda c: torch.distributions.Gamma(c, 2.0).rsample((256,)).mean(), backend="neuron")
    loss(concentration).backward()
    assert concentration.grad.shape == (3,) and torch.isfinite(concentration.grad).all()


@pytest.mark.parametrize(("call", "message"), [
    (lambda t: t.uniform_(3.0, 1.0), "uniform_ expects to return a \\[from, to\\) range"),
    (lambda t: t.uniform_(float("nan"), 1.0), "from is out of bounds for float"),
    (lambda t: t.exponential_(-1.0), "exponential_ expects lambda > 0.0"),
    (lambda t: t.normal_(0.0, -1.0), "normal expects std >= 0.0"),
])
def test_compiled_samplers_check_their_parameters_as_eager_does(call, message):
    """Traced, a reversed or NaN range, a negative rate or a negative std drew values anyway."""
    with pytest.raises(RuntimeError, match=message):
        call(torch.empty(8))
    with pytest.raises(Exception, match=message):
        torch.compile(lambda t: call(t.clone()), backend="neuron")(torch.empty(8))


def test_distributions_validate_their_arguments_on_the_device():
    """``torch.distributions``' argument checks call ``aten._is_all_true``, which had no lowering: every
    ``Categorical(...)`` on neuron warned and ran it on the CPU."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for values in ([True, True], [True, False], []):
            t = torch.tensor(values, dtype=torch.bool)
            assert torch.equal(torch._is_all_true(t.to("neuron")).cpu(), torch._is_all_true(t))
            assert torch.equal(torch._is_any_true(t.to("neuron")).cpu(), torch._is_any_true(t))
        categorical = torch.distributions.Categorical(logits=torch.randn(3, 5).to("neuron"))
        draws = categorical.sample((64,))
    assert draws.shape == (64, 3) and 0 <= int(draws.min().cpu()) and int(draws.max().cpu()) < 5


@pytest.mark.parametrize("training", [False, True])
def test_rrelu_on_the_device_returns_a_device_tensor(training):
    """``aten.rrelu_with_noise`` draws on the host and writes its noise argument: its output came back
    as a host tensor (the next neuron layer refused it; double backward hit an autograd assert)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.RReLU(), torch.nn.Linear(8, 2)).to("neuron")
    model.train(training)
    x = torch.randn(3, 8, device="neuron", requires_grad=True)
    y = F.rrelu(x, training=training)
    assert y.device == x.device
    out = model(x)
    assert out.device == x.device
    out.sum().backward()
    assert x.grad.device == x.device
    if not training:
        torch.testing.assert_close(y.detach().cpu(), F.rrelu(x.detach().cpu(), training=False))
