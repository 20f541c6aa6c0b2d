"""Shared test set-up: no test leaves a route decision behind for the next one."""

from __future__ import annotations

import pytest

from kernels import cpu


@pytest.fixture(autouse=True)
def fresh_cpu_routes():
    """The CPU backend's route caches (torch_int8_fast, the exactness probes, the AMX guard, oneDNN's
    refusals) are decided anew after every test: a test that forces a route (REPRO_CPU_GEMM=native, a
    monkeypatched probe) would otherwise leave it cached for every later file, whatever the order."""
    yield
    cpu.clear_route_caches()
