"""Shared test setup."""

import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread():
    """One torch thread for every test, as the experiments' and benchmarks' entry points use: the
    tensors here are small (one thread is faster) and the machines are shared."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
