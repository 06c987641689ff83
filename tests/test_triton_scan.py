"""The Triton scan (:mod:`semiring.triton_scan`) computes what the torch calls of ``Semiring.scan``
compute, in the Log and Max semirings: the states of every step and the gradients of the initial
state, the matrices and the unaries (Max: the backtrace), for a matrix per step and example, one
matrix for every step and example (a transition matrix), with and without unaries,
forbidden (-inf) transitions and states of no path, float32 and float64; and a chain program
(EmissionCRF, nn.CRF) runs its scan in one launch each way.

Marked ``triton``; without CUDA the kernel runs in Triton's interpreter on CPU tensors."""

from __future__ import annotations

import contextlib
import importlib.util
import os

import pytest
import torch
from torch.testing import assert_close

import semiring as sr
from semiring import triton_scan
from semiring.language import triton_levels
from structures import EmissionCRF
from scans import SHAPES, states_and_gradients
from scans import scan_inputs as shared_inputs
from test_triton import launches

CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if CUDA else "cpu")

pytestmark = [pytest.mark.triton,
              pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed"),
              pytest.mark.filterwarnings("ignore::RuntimeWarning"),
              pytest.mark.skipif(not CUDA and os.environ.get("TRITON_INTERPRET") != "1", reason="no CUDA and no interpreter"),
              pytest.mark.skipif(CUDA and os.environ.get("TRITON_INTERPRET") == "1",
                                 reason="TRITON_INTERPRET=1 beside a GPU: the interpreter cannot read device buffers")]

def using(triton: bool):
    """Runs inside take the scan kernel (in the interpreter without CUDA), or the torch calls."""
    if not triton:
        return triton_levels.disabled()
    return contextlib.nullcontext() if CUDA else triton_levels.interpreted()


def scan_inputs(shape: str, unary: bool, dtype, **sizes):
    return shared_inputs(shape, unary, dtype, device=DEVICE, **sizes)


def run(semiring, init, xs, u, triton: bool):
    """The states, and the gradients of (init, xs, u) (Max: a best path's backtrace)."""
    def check(*leaves):
        assert triton_scan.applies(*leaves) == triton

    with using(triton):
        return states_and_gradients(semiring, init, xs, u, "one end state" if semiring is sr.Max else "every state", check)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("unary", [True, False])
@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("semiring", [sr.Log, sr.Max], ids=["Log", "Max"])
def test_the_scan_kernel_gives_the_torch_calls_values_and_gradients(semiring, shape, unary, dtype):
    inputs = scan_inputs(shape, unary, dtype)
    want, want_grads = run(semiring, *inputs, triton=False)
    got, got_grads = run(semiring, *inputs, triton=True)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-12)
    assert_close(got, want, **tol)
    assert got[..., 4].eq(float("-inf")).any() == want[..., 4].eq(float("-inf")).any()
    for g, w in zip(got_grads, want_grads):
        assert_close(g, w, **tol)


@pytest.mark.parametrize("semiring", [sr.Log, sr.Max], ids=["Log", "Max"])
def test_a_chain_structure_takes_the_scan_kernel_in_one_launch_each_way(semiring, monkeypatch):
    from semiring import _triton_scan_kernels as kernels

    seen = launches(monkeypatch, kernels)
    g = torch.Generator().manual_seed(1)
    emissions = torch.randn(3, 7, 4, generator=g, dtype=torch.float64).to(DEVICE)
    transitions = torch.randn(4, 4, generator=g, dtype=torch.float64).to(DEVICE)
    lengths = torch.tensor([7, 3, 5], device=DEVICE)

    def marginals(triton: bool):
        with using(triton):
            d = EmissionCRF(emissions, transitions, lengths=lengths)
            return d.argmax if semiring is sr.Max else d.marginals

    want = marginals(False)
    seen.clear()
    got = marginals(True)
    assert [name for name, *_ in seen] == ["forward", "backward"]
    assert_close(got, want, rtol=1e-10, atol=1e-10)


def test_the_kernel_declines_what_it_does_not_take():
    init, xs, u = scan_inputs("a matrix per step and example", True, torch.float64)
    with triton_levels.interpreted():
        assert triton_scan.applies(init, xs, u)
        assert not triton_scan.applies(init, xs.float(), u)  # mixed dtypes
        assert not triton_scan.applies(init.half(), xs.half(), u.half())
        assert not triton_scan.applies(init[:0], xs[:0], u[:0])  # no examples
        big = triton_scan.MAX_STATES + 1
        assert not triton_scan.applies(init.new_zeros(3, big), xs.new_zeros(3, 6, big, big), None)
    with triton_levels.disabled():
        assert not triton_scan.applies(init, xs, u)


COMPILE = """
import triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from semiring import _triton_scan_kernels as kernels
ints = ["T", "K", "s_ib", "s_ik", "s_xb", "s_xt", "s_xk", "s_xl"]
for dtype, is_max, unary, bk in (("*fp32", False, True, 32), ("*fp64", True, False, 32), ("*fp32", True, True, 128),
                                 ("*fp64", False, False, 4)):
    forward = {**{p: dtype for p in ("init", "xs", "unary", "alphas", "base")}, **{i: "i32" for i in ints},
               **{i: "i32" for i in ("s_ub", "s_ut", "s_ul")}}
    backward = {**{p: dtype for p in ("init", "xs", "alphas", "base", "grad", "g_init", "g_xs", "g_unary")},
                **{i: "i32" for i in ints}}
    for kernel, signature, flags in ((kernels.forward, forward, {}), (kernels.backward, backward, {"PER_STEP": unary})):
        constants = dict(HAS_UNARY=unary, IS_MAX=is_max, **flags, BK=bk)
        source = ASTSource(kernel, signature | {c: "constexpr" for c in constants}, constants)
        assert len(triton.compile(source, target=GPUTarget("cuda", 90, 32)).asm["cubin"]) > 0
print("compiled")
"""


def test_the_scan_kernels_compile_for_an_h100_without_one():
    """The interpreter runs Python, not the compiler: both kernels also compile to a cubin for sm_90
    (Log and Max, float32 and float64, with and without unaries, at 4, 32 and 128 states, each met once)."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"TRITON_DEFAULT_FP_FUSION": "1"}
    done = subprocess.run([sys.executable, "-c", COMPILE], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "compiled" in done.stdout, done.stderr[-3000:]
