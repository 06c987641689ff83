"""Shared test setup."""

import ctypes
import os


def _cuda_devices() -> int:
    """The CUDA devices the driver sees (0 without a driver), asked without importing torch."""
    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return 0
    count = ctypes.c_int(0)
    return count.value if driver.cuInit(0) == 0 and driver.cuDeviceGetCount(ctypes.byref(count)) == 0 else 0


# Without a GPU, Triton's kernels (tests/test_triton.py) run in its interpreter on CPU tensors. The
# switch is read when Triton is imported, and `import torch` imports it: it is set before.
if not _cuda_devices():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture(autouse=True)
def one_thread():
    """One torch thread for every test, as the experiments' and benchmarks' entry points use: the
    tensors here are small (one thread is faster) and the machines are shared."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def distributions_validate_their_arguments(monkeypatch):
    """torch's default (validate_args on) in every test: the first torch.compile of the process turns
    it off for every distribution (torch._dynamo does), which would make tests depend on their order."""
    monkeypatch.setattr(torch.distributions.Distribution, "_validate_args", True)
