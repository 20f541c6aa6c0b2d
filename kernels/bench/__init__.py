"""Timing at the device level: ``layers`` (the INT8 CPU products next to fp32 torch, side by side in one
run: ``python -m kernels.bench.layers``), ``report`` (pytest-benchmark's JSON as the speed-up table), and
``devices`` (which device a measurement ran on, named in every timing output)."""
