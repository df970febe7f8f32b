"""mpviz.autograd against finite differences (and against torch, where installed).

Every op is checked the same way: build a scalar ``L = sum(w * op(inputs))`` with random weights
``w`` (so every output element gets a different upstream gradient), run ``L.backward()``, and
compare each input's ``.grad`` with the central difference ``(L(x + h) - L(x - h)) / 2h``,
element by element, in float64.
"""
import threading

import numpy as np
import pytest

import mpviz
from mpviz import autograd
from mpviz.nn import functional as F

pytestmark = pytest.mark.timeout(60)

RNG = np.random.default_rng(1234)


def leaf(*shape, low=-2.0, high=2.0, away_from_zero=False):
    values = RNG.uniform(low, high, shape)
    if away_from_zero:  # for abs/relu, whose derivative jumps at 0
        values = np.where(np.abs(values) < 0.2, 0.5, values)
    return mpviz.tensor(values, dtype=mpviz.float64, requires_grad=True)


def check_gradients(fn, *inputs, h=1e-6, tol=1e-6):
    """Compare autograd's gradients of sum(w * fn(*inputs)) with central finite differences."""
    out = fn(*inputs)
    w = mpviz.tensor(RNG.standard_normal(tuple(out.shape)), dtype=mpviz.float64)

    def scalar():
        with mpviz.no_grad():
            return float((fn(*inputs) * w).sum().item())

    for x in inputs:
        x.grad = None
    (out * w).sum().backward()
    for k, x in enumerate(inputs):
        if not (isinstance(x, mpviz.Tensor) and x.requires_grad):
            continue
        assert x.grad is not None, f"input {k} got no gradient"
        assert tuple(x.grad.shape) == tuple(x.shape), f"input {k}: grad shape {x.grad.shape} != {x.shape}"
        numeric = np.zeros(tuple(x.shape))
        values = x._np  # a writable view: nudge the leaf in place
        for i in np.ndindex(*values.shape):
            old = values[i]
            values[i] = old + h
            up = scalar()
            values[i] = old - h
            down = scalar()
            values[i] = old
            numeric[i] = (up - down) / (2 * h)
        np.testing.assert_allclose(x.grad.numpy(), numeric, rtol=tol, atol=tol,
                                   err_msg=f"gradient of input {k}")


# -- every op, against finite differences -----------------------------------------------------------

BINARY_CASES = {
    # name: (fn, shape of a, shape of b) — includes every kind of broadcasting
    "add": (lambda a, b: a + b, (3, 4), (3, 4)),
    "add-row": (lambda a, b: a + b, (3, 4), (4,)),
    "add-outer": (lambda a, b: a + b, (3, 1), (1, 4)),
    "add-scalar-tensor": (lambda a, b: a + b, (2, 3), ()),
    "sub-col": (lambda a, b: a - b, (3, 4), (3, 1)),
    "mul-row": (lambda a, b: a * b, (2, 3, 4), (4,)),
    "mul-middle": (lambda a, b: a * b, (2, 3, 4), (3, 1)),
    "div": (lambda a, b: a / b, (3, 4), (4,)),
    "pow-tensor-exponent": (lambda a, b: a ** b, (3, 4), (4,)),
    "matmul-2d": (lambda a, b: a @ b, (3, 4), (4, 5)),
    "matmul-matrix-vector": (lambda a, b: a @ b, (3, 4), (4,)),
    "matmul-vector-matrix": (lambda a, b: a @ b, (4,), (4, 5)),
    "matmul-dot": (lambda a, b: a @ b, (4,), (4,)),
    "matmul-batched": (lambda a, b: a @ b, (2, 3, 4), (4, 5)),
    "matmul-batched-vector": (lambda a, b: a @ b, (4,), (2, 4, 3)),
}


@pytest.mark.parametrize("name", sorted(BINARY_CASES))
def test_binary_ops_match_finite_differences(name):
    fn, sa, sb = BINARY_CASES[name]
    positive = name.startswith(("div", "pow"))
    a = leaf(*sa, low=0.5 if positive else -2, high=2.0)
    b = leaf(*sb, low=0.5 if positive else -2, high=2.0)
    check_gradients(fn, a, b)


NUMBER_CASES = {
    "add-number": lambda a: a + 2.5,
    "radd": lambda a: 2.5 + a,
    "sub-number": lambda a: a - 1.5,
    "rsub": lambda a: 1.5 - a,
    "mul-number": lambda a: a * 3.0,
    "rmul": lambda a: 3.0 * a,
    "div-number": lambda a: a / 4.0,
    "rtruediv": lambda a: 4.0 / a,
    "mul-ndarray": lambda a: a * np.arange(1.0, 5.0),
    "rmatmul-ndarray": lambda a: np.ones((2, 3)) @ a,
    "neg": lambda a: -a,
    "pow-2": lambda a: a ** 2,
    "pow-half": lambda a: a ** 0.5,
    "sqrt": lambda a: a.sqrt(),
    "exp": lambda a: a.exp(),
    "log": lambda a: a.log(),
    "tanh": lambda a: a.tanh(),
    "sigmoid": lambda a: a.sigmoid(),
    "clone": lambda a: a.clone() * 2,
}


@pytest.mark.parametrize("name", sorted(NUMBER_CASES))
def test_unary_and_number_ops_match_finite_differences(name):
    a = leaf(3, 4, low=0.5, high=2.0)  # positive: log, sqrt and 1/x are smooth there
    check_gradients(NUMBER_CASES[name], a)


@pytest.mark.parametrize("name", ["abs", "relu"])
def test_kinked_ops_match_finite_differences_away_from_the_kink(name):
    a = leaf(3, 4, away_from_zero=True)
    check_gradients(lambda x: getattr(x, name)(), a)


REDUCTION_CASES = {
    "sum-all": lambda a: a.sum(),
    "sum-dim0": lambda a: a.sum(0),
    "sum-dim-last-keepdim": lambda a: a.sum(-1, keepdim=True),
    "sum-tuple": lambda a: a.sum((0, 2)),
    "mean-all": lambda a: a.mean(),
    "mean-dim1": lambda a: a.mean(1),
    "mean-keepdim": lambda a: a.mean(2, keepdim=True),
    "max-all": lambda a: a.max(),
    "max-dim": lambda a: a.max(1).values,
    "max-dim-keepdim": lambda a: a.max(-1, keepdim=True)[0],
    "min-all": lambda a: a.min(),
    "min-dim": lambda a: a.min(1).values,
    "min-dim-keepdim": lambda a: a.min(-1, keepdim=True)[0],
}


@pytest.mark.parametrize("name", sorted(REDUCTION_CASES))
def test_reductions_match_finite_differences(name):
    check_gradients(REDUCTION_CASES[name], leaf(2, 3, 4))


VIEW_CASES = {
    "transpose": lambda a: a.transpose(0, 2),
    "t": lambda a: a[0].t(),
    "reshape-view": lambda a: a.reshape(6, 4),
    "reshape-copy": lambda a: a.transpose(0, 1).reshape(-1),  # not contiguous: reshape copies
    "view-flatten": lambda a: a.view(2, 12),
    "unsqueeze-squeeze": lambda a: a.unsqueeze(0).squeeze(0) * 2,
    "getitem-int": lambda a: a[1],
    "getitem-slices": lambda a: a[:, 1:, ::2],
    "getitem-negative-step-free": lambda a: a[..., -1],
    "getitem-list-with-repeats": lambda a: a[[0, 1, 0]],      # a[0] used twice: grads add up
    "getitem-pairs": lambda a: a[np.array([0, 1, 1]), np.array([2, 0, 2])],
    "getitem-mask": lambda a: a[a.detach() > 0],
    "getitem-tensor-index": lambda a: a[mpviz.tensor([1, 0])],
}


@pytest.mark.parametrize("name", sorted(VIEW_CASES))
def test_views_and_indexing_match_finite_differences(name):
    check_gradients(VIEW_CASES[name], leaf(2, 3, 4))


def test_losses_match_finite_differences():
    x = leaf(5, 3)
    y = mpviz.tensor([0, 2, 1, 1, 0])
    check_gradients(lambda a: F.log_softmax(a, 1), x)
    check_gradients(lambda a: F.log_softmax(a, 0), x)
    check_gradients(lambda a: F.cross_entropy(a, y), x)
    check_gradients(lambda a: F.nll_loss(F.log_softmax(a, 1), y, reduction="sum"), x)
    target = mpviz.tensor(RNG.standard_normal((5, 3)), dtype=mpviz.float64)
    check_gradients(lambda a: F.mse_loss(a, target), x)


def test_a_small_mlp_matches_finite_differences():
    x = mpviz.tensor(RNG.standard_normal((6, 3)), dtype=mpviz.float64)
    y = mpviz.tensor([0, 1, 2, 1, 0, 2])
    w1, b1, w2, b2 = leaf(4, 3), leaf(4), leaf(3, 4), leaf(3)

    def net(w1, b1, w2, b2):
        return F.cross_entropy((x @ w1.t() + b1).tanh() @ w2.t() + b2, y)
    check_gradients(net, w1, b1, w2, b2)


# -- how the graph behaves ---------------------------------------------------------------------

def test_a_tensor_used_twice_gets_both_gradients():
    x = mpviz.tensor([1.0, 2.0, 3.0], requires_grad=True)
    (x * x + x).sum().backward()
    assert x.grad.tolist() == [3.0, 5.0, 7.0]  # 2x + 1


def test_grads_accumulate_until_zeroed():
    x = mpviz.tensor([1.0, 2.0], requires_grad=True)
    (x * 3).sum().backward()
    grad = x.grad
    (x * 3).sum().backward()
    assert x.grad.tolist() == [6.0, 6.0]
    assert x.grad is grad  # accumulated in place: a grad in shared memory stays shared


def test_only_leaves_that_require_grad_get_grad():
    x = mpviz.tensor([1.0, 2.0], requires_grad=True)
    c = mpviz.tensor([5.0, 7.0])
    y = x * c
    y.sum().backward()
    assert c.grad is None and y.grad is None
    assert x.grad.tolist() == [5.0, 7.0]
    assert x.is_leaf and not y.is_leaf and y.requires_grad
    assert "grad_fn=<MulBackward0>" in repr(y)


def test_result_stays_float32_and_grad_has_leaf_dtype():
    x = mpviz.randn(3, 4, requires_grad=True)
    y = (x * 2.5 + 1).relu().mean()
    assert y.dtype == mpviz.float32
    y.backward()
    assert x.grad.dtype == mpviz.float32


def test_reshape_and_transpose_are_views_that_still_differentiate():
    x = mpviz.arange(6.0).requires_grad_()
    r = x.reshape(2, 3)
    t = r.t()
    assert r.untyped_storage() is x.untyped_storage() is t.untyped_storage()
    assert r.grad_fn is not None and t.grad_fn is not None
    (t * mpviz.tensor([[1.0, 2.0]])).sum().backward()
    assert x.grad.tolist() == [1.0, 1.0, 1.0, 2.0, 2.0, 2.0]


def test_max_with_dim_returns_values_and_indices_like_torch():
    x = mpviz.tensor([[1.0, 5.0, 2.0], [7.0, 0.0, 3.0]])
    values, indices = x.max(1)
    assert values.tolist() == [5.0, 7.0] and indices.tolist() == [1, 0]
    assert x.max().item() == 7.0


def test_min_with_dim_returns_values_and_indices_like_torch():
    x = mpviz.tensor([[1.0, 5.0, 2.0], [7.0, 0.0, 3.0]])
    values, indices = x.min(1)
    assert values.tolist() == [1.0, 0.0] and indices.tolist() == [0, 1]
    assert type(x.min(1)).__name__ == "min" and x.min().item() == 0.0
    assert x.argmin().item() == 4 and x.argmin(1).tolist() == [0, 1]


def test_max_without_dim_shares_the_gradient_between_ties():
    x = mpviz.tensor([3.0, 1.0, 3.0], requires_grad=True)
    x.max().backward()
    assert x.grad.tolist() == [0.5, 0.0, 0.5]


def test_deep_graphs_do_not_hit_the_recursion_limit():
    x = mpviz.tensor(1.0, requires_grad=True)
    y = x
    for _ in range(5000):
        y = y + 1.0
    y.backward()
    assert x.grad.item() == 1.0


def test_inplace_ops_and_detach_do_not_record():
    x = mpviz.tensor([1.0, 2.0], requires_grad=True)
    d = x.detach()
    assert not d.requires_grad and d.untyped_storage() is x.untyped_storage()
    x.add_(1.0)  # what an optimizer does: no graph
    assert x.is_leaf and x.grad_fn is None


# -- no_grad ------------------------------------------------------------------------------------

def test_no_grad_as_context_manager_and_decorator():
    x = mpviz.tensor([1.0], requires_grad=True)
    assert mpviz.is_grad_enabled()
    with mpviz.no_grad():
        assert not mpviz.is_grad_enabled()
        y = x * 2
        with mpviz.enable_grad():
            assert (x * 2).requires_grad
        assert not mpviz.is_grad_enabled()
    assert mpviz.is_grad_enabled()
    assert not y.requires_grad and y.grad_fn is None

    @mpviz.no_grad()
    def evaluate():
        return x * 2
    assert not evaluate().requires_grad and mpviz.is_grad_enabled()


def test_no_grad_is_restored_after_an_exception():
    with pytest.raises(KeyError):
        with mpviz.no_grad():
            raise KeyError("boom")
    assert mpviz.is_grad_enabled()


def test_no_grad_is_per_thread():
    seen = []
    with mpviz.no_grad():
        t = threading.Thread(target=lambda: seen.append(mpviz.is_grad_enabled()))
        t.start()
        t.join()
    assert seen == [True]


# -- errors say what and how to fix ----------------------------------------------------------------

def test_backward_on_a_tensor_without_grad_says_so():
    with pytest.raises(RuntimeError, match="element 0 of tensors does not require grad and does not have a grad_fn"):
        mpviz.tensor([1.0, 2.0]).sum().backward()


def test_backward_on_a_non_scalar_needs_a_gradient():
    x = mpviz.tensor([1.0, 2.0], requires_grad=True)
    with pytest.raises(RuntimeError, match="grad can be implicitly created only for scalar outputs"):
        (x * 2).backward()
    (x * 2).backward(mpviz.tensor([1.0, 10.0]))
    assert x.grad.tolist() == [2.0, 20.0]
    with pytest.raises(ValueError, match="Mismatch in shape"):
        (x * 2).backward(mpviz.tensor([1.0, 2.0, 3.0]))


def test_bad_dims_and_shapes_are_reported():
    x = mpviz.zeros(2, 3)
    with pytest.raises(ValueError, match="out of range"):
        x.sum(2)
    with pytest.raises(TypeError, match="dim must be an int"):
        x.sum("rows")
    with pytest.raises(ValueError, match="invalid for a tensor of shape"):
        x.reshape(4, 2)
    with pytest.raises(TypeError):
        autograd.set_grad_enabled("yes")


# -- oracle: the same numbers as torch ---------------------------------------------------------------

@pytest.fixture(scope="module")
def torch():
    """torch, imported and its autograd engine run once before any test's leak check counts fds.

    A CUDA build of torch opens the driver's device files and a socket the first time it runs
    backward, and keeps them for the life of the process. Module scope: set up before the
    per-test leak check takes its snapshot, so that check counts only what a test leaves.
    """
    torch = pytest.importorskip("torch", reason="torch is not installed: the finite-difference checks above stand in for it")
    x = torch.ones(1, requires_grad=True)
    (x * 2).sum().backward()
    return torch


def test_gradients_match_torch(torch):
    x = RNG.standard_normal((5, 3))
    w = RNG.standard_normal((4, 3))
    y = np.array([0, 3, 1, 2, 0])
    mx, mw = mpviz.tensor(x, requires_grad=True), mpviz.tensor(w, requires_grad=True)
    F.cross_entropy((mx @ mw.t()).tanh(), mpviz.tensor(y)).backward()
    tx = torch.tensor(x, dtype=torch.float32, requires_grad=True)
    tw = torch.tensor(w, dtype=torch.float32, requires_grad=True)
    torch.nn.functional.cross_entropy((tx @ tw.t()).tanh(), torch.tensor(y)).backward()
    np.testing.assert_allclose(mx.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(mw.grad.numpy(), tw.grad.numpy(), rtol=1e-4, atol=1e-6)


# The same expression, written once, run with `T` = mpviz or torch (the `import mpviz as torch` idea).
TORCH_CASES = {
    "add-broadcast": lambda T, F, a, b: a + b[0],
    "sub-mul-div": lambda T, F, a, b: (a - b) * a / (b.abs() + 1),
    "pow-sqrt": lambda T, F, a, b: (a ** 2 + 1).sqrt(),
    "matmul": lambda T, F, a, b: a @ b.t(),
    "unary": lambda T, F, a, b: a.exp() + (a.abs() + 1).log() + a.tanh() + a.sigmoid() + a.relu(),
    "reductions": lambda T, F, a, b: a.sum(1) + a.mean(0).sum() + a.max(1)[0] + a.max() + a.min(0)[0].sum() + a.min(),
    "views": lambda T, F, a, b: a.transpose(0, 1).reshape(-1)[[0, 0, 5]] + a[:, 1:].sum(),
    "log_softmax": lambda T, F, a, b: F.log_softmax(a * b, 1),
    "cross_entropy": lambda T, F, a, b: F.cross_entropy(a @ b.t(), T.tensor([0, 3, 1, 2])),
    "nll_loss": lambda T, F, a, b: F.nll_loss(F.log_softmax(a, 0), T.tensor([1, 0, 2, 2]), reduction="sum"),
    "mse_loss": lambda T, F, a, b: F.mse_loss(a, b),
}


@pytest.mark.parametrize("name", sorted(TORCH_CASES))
def test_gradients_match_torch_op_by_op(name, torch):
    a, b = RNG.standard_normal((4, 3)), RNG.standard_normal((4, 3))
    grads, values = [], []
    for T, F_ in ((mpviz, F), (torch, torch.nn.functional)):
        ta = T.tensor(a, dtype=T.float64, requires_grad=True)
        tb = T.tensor(b, dtype=T.float64, requires_grad=True)
        out = TORCH_CASES[name](T, F_, ta, tb)
        values.append(np.array(out.detach().numpy(), copy=True))
        out.sum().backward()
        grads.append([np.array(g.numpy(), copy=True) if g is not None else None
                      for g in (ta.grad, tb.grad)])
    np.testing.assert_allclose(values[0], values[1], rtol=1e-10, atol=1e-12)
    for mine, theirs in zip(*grads):
        if theirs is None:
            assert mine is None
        else:
            np.testing.assert_allclose(mine, theirs, rtol=1e-10, atol=1e-12)
