"""Placeholder arithmetic without gradients (replaced by the micrograd-sized autograd, issue #3)."""
import numpy as np

from .tensor import Tensor, _raw


def _out(tensor_like, value):
    device = next((t.device for t in tensor_like if isinstance(t, Tensor)), "cpu")
    return Tensor._wrap(np.asarray(value), device)


def _binary(op):
    def f(a, b):
        return _out((a, b), op(_raw(a), _raw(b)))
    return f


add, sub, mul, div, matmul = (_binary(np.add), _binary(np.subtract), _binary(np.multiply),
                              _binary(np.true_divide), _binary(np.matmul))


def pow(a, e):
    return _out((a,), np.power(_raw(a), _raw(e)))


def neg(a): return _out((a,), -_raw(a))
def exp(a): return _out((a,), np.exp(_raw(a)))
def log(a): return _out((a,), np.log(_raw(a)))
def abs(a): return _out((a,), np.abs(_raw(a)))
def relu(a): return _out((a,), np.maximum(_raw(a), 0))
def tanh(a): return _out((a,), np.tanh(_raw(a)))
def sigmoid(a): return _out((a,), 1 / (1 + np.exp(-_raw(a))))
def sum(a, dim=None, keepdim=False): return _out((a,), np.sum(_raw(a), axis=dim, keepdims=keepdim))
def mean(a, dim=None, keepdim=False): return _out((a,), np.mean(_raw(a), axis=dim, keepdims=keepdim))
def max(a, dim=None, keepdim=False): return _out((a,), np.max(_raw(a), axis=dim, keepdims=keepdim))


def transpose(a, d0, d1):
    return a._as_view(np.swapaxes(a._np, d0, d1))


def reshape(a, shape):
    r = a._np.reshape(shape)
    v = a._as_view(r)
    return v if v is not None else Tensor._wrap(r, a.device)


def clone(a):
    return Tensor._wrap(a.__array__().copy(), a.device)


def track_getitem(out, src, index):
    pass


def backward(t, gradient=None):
    raise NotImplementedError("autograd is not built yet")
