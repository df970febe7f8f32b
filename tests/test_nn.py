"""mpviz.nn (Module, Parameter, layers, functional) and mpviz.optim.SGD."""
import pickle

import numpy as np
import pytest

import mpviz
from mpviz import nn, optim
from mpviz.nn import functional as F

import nn_workers

pytestmark = pytest.mark.timeout(60)


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 2)
        self.body = nn.Sequential(nn.Linear(2, 4), nn.ReLU(), nn.Linear(4, 2))
        self.scale = nn.Parameter(mpviz.ones(2))
        self.name = "tiny"  # a plain attribute: not a parameter

    def forward(self, x):
        return self.body(self.fc(x)) * self.scale


# -- Parameter ---------------------------------------------------------------------------------------

def test_parameter_requires_grad_and_shares_its_data():
    data = mpviz.zeros(3)
    p = nn.Parameter(data)
    assert isinstance(p, mpviz.Tensor) and p.requires_grad and p.is_leaf
    assert p.untyped_storage() is data.untyped_storage()
    assert not nn.Parameter(data, requires_grad=False).requires_grad
    assert repr(p).startswith("Parameter containing:\ntensor(")
    with pytest.raises(TypeError, match="expects a Tensor"):
        nn.Parameter([1.0, 2.0])


def test_parameter_rebuilds_the_way_the_unpickler_builds_it():
    p = nn.Parameter(mpviz.arange(4.0))
    q = mpviz.Tensor.__new__(nn.Parameter)
    mpviz.Tensor.__init__(q, p._storage, p._offset, p._shape, p._strides, p.dtype, True)
    assert isinstance(q, nn.Parameter) and q.requires_grad and q.tolist() == [0.0, 1.0, 2.0, 3.0]
    r = pickle.loads(pickle.dumps(p))  # plain pickle: a copy, still a Parameter
    assert isinstance(r, nn.Parameter) and r.tolist() == p.tolist()
    assert r.untyped_storage() is not p.untyped_storage()


# -- Module ------------------------------------------------------------------------------------------

def test_module_registers_parameters_and_submodules_by_assignment():
    m = Tiny()
    names = [n for n, _ in m.named_parameters()]
    assert names == ["scale", "fc.weight", "fc.bias", "body.0.weight", "body.0.bias",
                     "body.2.weight", "body.2.bias"]
    assert all(isinstance(p, nn.Parameter) for p in m.parameters())
    assert [type(c).__name__ for c in m.children()] == ["Linear", "Sequential"]
    assert [n for n, _ in m.named_modules()] == ["", "fc", "body", "body.0", "body.1", "body.2"]
    assert m.name == "tiny" and "name" not in m._parameters
    assert m.fc is m._modules["fc"] and m.scale is m._parameters["scale"]
    assert [n for n, _ in m.named_parameters(recurse=False)] == ["scale"]
    assert "(fc): Linear(in_features=3, out_features=2, bias=True)" in repr(m)


def test_a_parameter_shared_by_two_layers_is_listed_once():
    a, b = nn.Linear(2, 2), nn.Linear(2, 2)
    b.weight = a.weight
    model = nn.Sequential(a, b)
    assert len(list(model.parameters())) == 3


def test_module_call_runs_forward_and_modes_propagate():
    m = Tiny()
    out = m(mpviz.randn(5, 3))
    assert tuple(out.shape) == (5, 2) and out.requires_grad
    assert m.training and m.body[1].training
    assert m.eval() is m and not m.training and not m.body[1].training
    m.train()
    assert m.body[2].training
    with pytest.raises(NotImplementedError, match="forward"):
        nn.Module()(1)


def test_module_assignment_errors_explain_the_fix():
    class Forgot(nn.Module):
        def __init__(self):
            self.fc = nn.Linear(1, 1)
    with pytest.raises(AttributeError, match=r"super\(\).__init__\(\)"):
        Forgot()
    m = nn.Linear(2, 2)
    with pytest.raises(TypeError, match=r"nn.Parameter or None expected"):
        m.weight = mpviz.zeros(2, 2)
    m.bias = None
    assert [n for n, _ in m.named_parameters()] == ["weight"]
    assert tuple(m(mpviz.ones(1, 2)).shape) == (1, 2)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        m.nope


def test_zero_grad_sets_grads_to_none_or_zero():
    m = Tiny()
    F.mse_loss(m(mpviz.randn(4, 3)), mpviz.zeros(4, 2)).backward()
    assert all(p.grad is not None for p in m.parameters())
    m.zero_grad(set_to_none=False)
    assert all(p.grad is not None and not p.grad.numpy().any() for p in m.parameters())
    m.zero_grad()
    assert all(p.grad is None for p in m.parameters())


# -- layers --------------------------------------------------------------------------------------

def test_linear_uses_torch_init_bounds_and_computes_x_wT_plus_b():
    mpviz.manual_seed(0)
    lin = nn.Linear(16, 300)
    bound = 1 / 4.0
    w, b = lin.weight.detach().numpy(), lin.bias.detach().numpy()
    assert w.shape == (300, 16) and b.shape == (300,) and w.dtype == np.float32
    assert np.abs(w).max() <= bound and np.abs(b).max() <= bound
    assert np.abs(w).max() > 0.9 * bound  # uniform over the whole range, not a narrower one
    x = mpviz.randn(7, 16)
    np.testing.assert_allclose(lin(x).detach().numpy(), x.numpy() @ w.T + b, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="positive"):
        nn.Linear(0, 3)
    with pytest.raises(TypeError, match="must be an int"):
        nn.Linear(2.5, 3)


def test_manual_seed_makes_models_repeat():
    mpviz.manual_seed(7)
    a = nn.Linear(3, 3).weight.tolist()
    mpviz.manual_seed(7)
    assert nn.Linear(3, 3).weight.tolist() == a


def test_sequential_indexing_and_type_check():
    s = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1))
    assert len(s) == 3 and isinstance(s[1], nn.ReLU) and len(s[:2]) == 2
    assert [type(m).__name__ for m in s] == ["Linear", "ReLU", "Linear"]
    with pytest.raises(TypeError, match="Sequential takes Modules"):
        nn.Sequential(nn.Linear(1, 1), F.relu)


# -- state_dict ----------------------------------------------------------------------------------------

def test_state_dict_round_trip():
    mpviz.manual_seed(1)
    a, b = Tiny(), Tiny()
    x = mpviz.randn(4, 3)
    state = a.state_dict()
    assert list(state) == [n for n, _ in a.named_parameters()]
    assert all(not t.requires_grad for t in state.values())
    assert state["fc.weight"].untyped_storage() is a.fc.weight.untyped_storage()  # no copy
    assert not np.allclose(a(x).detach().numpy(), b(x).detach().numpy())
    storage_before = b.fc.weight.untyped_storage()
    assert b.load_state_dict(state) == ([], [])
    np.testing.assert_array_equal(a(x).detach().numpy(), b(x).detach().numpy())
    assert b.fc.weight.untyped_storage() is storage_before  # copied into, not replaced
    copied = pickle.loads(pickle.dumps(state))             # e.g. saved to a file
    c = Tiny()
    c.load_state_dict(copied)
    np.testing.assert_array_equal(a(x).detach().numpy(), c(x).detach().numpy())


def test_a_whole_module_pickles_and_deep_copies():
    import copy
    m = Tiny()
    x = mpviz.randn(2, 3)
    for twin in (pickle.loads(pickle.dumps(m)), copy.deepcopy(m)):
        assert isinstance(twin.fc.weight, nn.Parameter) and twin.name == "tiny"
        assert twin.fc.weight.untyped_storage() is not m.fc.weight.untyped_storage()
        np.testing.assert_array_equal(twin(x).detach().numpy(), m(x).detach().numpy())


def test_load_state_dict_reports_missing_unexpected_and_mismatched_keys():
    m = Tiny()
    state = m.state_dict()
    del state["scale"]
    state["extra"] = mpviz.zeros(1)
    with pytest.raises(ValueError, match=r'Missing key\(s\) in state_dict: "scale"(.|\n)*Unexpected key\(s\) in state_dict: "extra"'):
        m.load_state_dict(state)
    assert m.load_state_dict(state, strict=False) == (["scale"], ["extra"])
    bad = m.state_dict()
    bad["fc.bias"] = mpviz.zeros(5)
    with pytest.raises(ValueError, match=r"size mismatch for fc.bias: copying a param with shape \[5\]"):
        m.load_state_dict(bad)
    with pytest.raises(TypeError, match="dict of tensors"):
        m.load_state_dict([1, 2])


def test_load_state_dict_into_a_shared_model_keeps_it_shared(strategy):
    a, b = Tiny(), Tiny()
    b.share_memory()
    b.load_state_dict(a.state_dict())
    assert all(p.is_shared() for p in b.parameters())
    assert all(p.untyped_storage().location == strategy for p in b.parameters())


# -- share_memory ----------------------------------------------------------------------------------

def test_share_memory_shares_parameters_and_existing_grads_in_place(strategy):
    m = Tiny()
    F.mse_loss(m(mpviz.randn(2, 3)), mpviz.zeros(2, 2)).backward()
    m.fc.bias.grad = None  # a parameter without a grad: nothing to share there
    params = list(m.parameters())
    storages = [p.untyped_storage() for p in params]
    assert not any(p.is_shared() for p in params)
    assert m.share_memory() is m
    assert [p.untyped_storage() for p in params] == storages  # same objects, bytes moved in place
    assert all(p.is_shared() for p in params)
    assert all(p.grad.is_shared() for p in params if p.grad is not None)
    assert m.fc.bias.grad is None
    grad = m.fc.weight.grad
    F.mse_loss(m(mpviz.randn(2, 3)), mpviz.zeros(2, 2)).backward()
    assert m.fc.weight.grad is grad and grad.is_shared()  # accumulated into the shared grad


def test_shared_grads_are_seen_by_a_child(ctx):
    m = nn.Linear(2, 2)
    F.mse_loss(m(mpviz.ones(1, 2)), mpviz.zeros(1, 2)).backward()
    m.share_memory()
    before = [p.grad.tolist() for p in m.parameters()]
    p = ctx.Process(target=nn_workers.add_to_grads, args=(m, 1.0))
    p.start()
    p.join(30)
    assert p.exitcode == 0
    after = [p.grad.numpy() for p in m.parameters()]
    for b, a in zip(before, after):
        np.testing.assert_allclose(a, np.asarray(b) + 1.0)


# -- across a queue ------------------------------------------------------------------------------------

def test_a_non_leaf_that_requires_grad_is_refused_by_a_queue_and_detach_fixes_it(ctx):
    q_in, q_out = ctx.Queue(), ctx.Queue()
    x = mpviz.tensor([1.0, 2.0], requires_grad=True)
    y = x * 3
    with pytest.raises(RuntimeError, match=r"Cowardly refusing to serialize non-leaf tensor which requires_grad(.|\n)*detach\(\)"):
        q_in.put(y)
    p = ctx.Process(target=nn_workers.receive_and_report, args=(q_in, q_out))
    p.start()
    q_in.put(y.detach())
    assert q_out.get(timeout=30) == ([3.0, 6.0], False)
    p.join(30)
    assert p.exitcode == 0


def test_a_model_sent_through_a_queue_arrives_as_parameters_on_shared_memory(ctx):
    from mpviz.examples import MyModel, accuracy, make_blobs
    mpviz.manual_seed(3)
    model = MyModel()
    before = model.fc1.weight.detach().clone()
    q_in, q_out = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=nn_workers.train_from_queue, args=(q_in, q_out), kwargs=dict(rank=0))
    p.start()
    q_in.put(model)
    kinds, shared = q_out.get(timeout=60)
    p.join(30)
    assert p.exitcode == 0
    assert kinds == ["Parameter"] and shared
    assert model.fc1.weight.is_shared()  # put() moved the parent's own bytes into shared memory
    assert not model.fc1.weight.equal(before)  # the child's training reached the parent
    assert accuracy(model, *make_blobs(500, seed=1)) > 0.8


# -- functional ---------------------------------------------------------------------------------------

def test_log_softmax_is_stable_and_normalised():
    x = mpviz.tensor([[1000.0, 0.0, -1000.0], [1.0, 2.0, 3.0]])
    out = F.log_softmax(x, 1).detach().numpy()
    assert np.isfinite(out).all()
    np.testing.assert_allclose(np.exp(out).sum(1), [1.0, 1.0], rtol=1e-6)
    np.testing.assert_allclose(out[1], np.log(np.exp([1, 2, 3]) / np.exp([1, 2, 3]).sum()), rtol=1e-6)


def test_cross_entropy_nll_and_mse_values():
    logits = mpviz.tensor([[2.0, 0.5, -1.0], [0.1, 0.2, 3.0]])
    target = mpviz.tensor([0, 2])
    lp = np.log(np.exp(logits.numpy()) / np.exp(logits.numpy()).sum(1, keepdims=True))
    expected = -(lp[0, 0] + lp[1, 2]) / 2
    assert F.cross_entropy(logits, target).item() == pytest.approx(expected, rel=1e-6)
    assert F.nll_loss(F.log_softmax(logits, 1), target, reduction="sum").item() == pytest.approx(2 * expected, rel=1e-6)
    assert F.nll_loss(F.log_softmax(logits, 1), target, reduction="none").shape == (2,)
    assert F.mse_loss(mpviz.tensor([1.0, 3.0]), mpviz.tensor([0.0, 0.0])).item() == 5.0
    assert F.relu(mpviz.tensor([-1.0, 2.0])).tolist() == [0.0, 2.0]


def test_loss_errors_name_the_problem():
    logits = mpviz.zeros(2, 3)
    with pytest.raises(TypeError, match="integer tensor"):
        F.cross_entropy(logits, mpviz.tensor([0.0, 1.0]))
    with pytest.raises(ValueError, match=r"outside \[0, 3\)"):
        F.cross_entropy(logits, mpviz.tensor([0, 3]))
    with pytest.raises(ValueError, match="one class per row"):
        F.cross_entropy(logits, mpviz.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match="same shape"):
        F.mse_loss(logits, mpviz.zeros(3, 2))
    with pytest.raises(ValueError, match="avg is not a valid value for reduction. Why: mse_loss"):
        F.mse_loss(logits, logits, reduction="avg")
    with pytest.raises(TypeError, match="to be a Tensor"):
        F.relu([1.0])


# -- optim.SGD -----------------------------------------------------------------------------------------

def test_sgd_updates_parameters_in_place():
    p = nn.Parameter(mpviz.tensor([1.0, 2.0]))
    ptr, storage = p.data_ptr(), p.untyped_storage()
    opt = optim.SGD([p], lr=0.5)
    (p * mpviz.tensor([2.0, 4.0])).sum().backward()
    opt.step()
    assert p.tolist() == [0.0, 0.0]
    assert p.data_ptr() == ptr and p.untyped_storage() is storage
    opt.zero_grad()
    assert p.grad is None
    opt.step()  # no grad: nothing moves
    assert p.tolist() == [0.0, 0.0]


def test_sgd_momentum_matches_the_torch_rule():
    p = nn.Parameter(mpviz.tensor([1.0]))
    opt = optim.SGD([p], lr=0.1, momentum=0.9)
    expected, buf = 1.0, None
    for step in range(4):
        opt.zero_grad()
        (p * p).sum().backward()  # grad = 2p
        g = 2 * expected
        buf = g if buf is None else 0.9 * buf + g
        expected -= 0.1 * buf
        opt.step()
        assert p.item() == pytest.approx(expected, rel=1e-6), f"step {step}"


def test_sgd_trains_a_model_and_validates_its_arguments():
    from mpviz.examples import MyModel, accuracy, make_blobs, train
    mpviz.manual_seed(0)
    model = MyModel()
    train(model, rank=0)
    assert accuracy(model, *make_blobs(500, seed=1)) > 0.9
    with pytest.raises(TypeError, match="single Tensor"):
        optim.SGD(mpviz.zeros(2), lr=0.1)
    with pytest.raises(ValueError, match="empty parameter list"):
        optim.SGD([], lr=0.1)
    with pytest.raises(ValueError, match="Invalid lr"):
        optim.SGD(model.parameters(), lr=-1)
    with pytest.raises(TypeError, match="must be a number"):
        optim.SGD(model.parameters(), lr="fast")
    x = mpviz.zeros(2, requires_grad=True)
    with pytest.raises(ValueError, match="non-leaf"):
        optim.SGD([x * 2], lr=0.1)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_mse_loss_module_matches_torchs_value_and_gradient(reduction):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal((4, 3))
    y = y.astype(np.float32)
    ours_x = mpviz.tensor(x, requires_grad=True)
    ours = nn.MSELoss(reduction=reduction)(ours_x, mpviz.tensor(y))
    theirs_x = torch.tensor(x, requires_grad=True)
    theirs = torch.nn.MSELoss(reduction=reduction)(theirs_x, torch.tensor(y))
    np.testing.assert_allclose(ours.detach().numpy(), theirs.detach().numpy(), rtol=1e-6)
    ours.sum().backward()
    theirs.sum().backward()
    np.testing.assert_allclose(ours_x.grad.numpy(), theirs_x.grad.numpy(), rtol=1e-6)
    assert repr(nn.MSELoss(reduction=reduction)) == repr(torch.nn.MSELoss(reduction=reduction))


def test_mse_loss_with_a_reduction_torch_does_not_know_says_torchs_words_and_the_fix():
    with pytest.raises(ValueError) as info:
        nn.MSELoss(reduction="avg")
    assert str(info.value).startswith("avg is not a valid value for reduction. Why:")  # torch's
    assert 'Fix: reduction="mean", "sum" or "none".' in str(info.value)
