"""Side-by-side timing of the INT8 CPU backend against fp32 torch (one process, one run).

    python -m kernels.bench.layers [--reps 7] [--channels-last] [--resnet18] [--mobilenet-v2-depthwise]
                                   [--quant-profile] [--cpu-time]

For each layer: forward, input gradient and weight gradient, the int8 op alone (kernels.cpu on int8
operands, int32 out) next to fp32 (F.conv2d / torch.nn.grad / matmul) on the same shapes;
milliseconds, best of --reps runs after a warm-up (robust to other load). --resnet18 adds the conv
shapes of a CIFAR ResNet-18 step (batch 64, 32x32) and their totals; --mobilenet-v2-depthwise the
depthwise convolutions of a MobileNetV2 step (batch 32, 112x112, as `repro step-time`) and their totals
(the depthwise kernels' target: at least fp32's speed; every row prints fp32 / int8). --quant-profile
times the pieces of the quantize/dequantize steps around the int8 ops (repro.quant, DAIQ's channel
statistics) on the largest ResNet-50 tensors next to the int8 op they serve: the profile behind
kernel_speedup.md's "quantization" verdicts. --cpu-time measures CPU seconds of this process instead of
wall time (run with OMP_NUM_THREADS=1 on a busy machine). The full per-layer comparison is ``make bench``.
"""

from __future__ import annotations

import argparse
import functools
import time

import torch
import torch.nn.functional as F
from torch.nn import grad as tgrad

from kernels import cpu

_CLOCK = time.perf_counter


def time_round_robin(rows, reps: int):
    """Best-of-reps milliseconds of every callable, the reps taken round-robin over all of them, so
    that a burst of other load on the machine cannot spoil all samples of one op."""
    fns = [fn for _, fns in rows for fn in fns]
    for fn in fns:  # warm-up: oneDNN primitive creation, prepack caches, allocator
        fn()
        fn()
    best = [float("inf")] * len(fns)
    for _ in range(reps):
        for i, fn in enumerate(fns):
            t0 = _CLOCK()
            fn()
            best[i] = min(best[i], _CLOCK() - t0)
    it = iter(best)
    return [(name, [next(it) * 1e3 for _ in fns]) for name, fns in rows]


def _q(shape, cl: bool) -> torch.Tensor:
    t = torch.randint(-127, 128, shape, dtype=torch.int8)
    return t.contiguous(memory_format=torch.channels_last) if cl and len(shape) == 4 else t


def _f(shape, cl: bool) -> torch.Tensor:
    t = torch.randn(shape)
    return t.contiguous(memory_format=torch.channels_last) if cl and len(shape) == 4 else t


def conv_row(name, n, cin, cout, hw, k, stride, pad, groups, cl):
    x, w = _f((n, cin, hw, hw), cl), torch.randn(cout, cin // groups, k, k)
    y = F.conv2d(x, w, stride=stride, padding=pad, groups=groups)
    g = _f(tuple(y.shape), cl)
    xq, wq, gq = _q(x.shape, cl), _q(w.shape, False), _q(y.shape, cl)
    args = (stride, pad, 1, groups)
    kw = dict(stride=stride, padding=pad, groups=groups)
    return name, [
        lambda: cpu.conv_forward(xq, wq, *args),
        lambda: F.conv2d(x, w, **kw),
        lambda: cpu.conv_input_grad(gq, wq, x.shape, *args),
        lambda: tgrad.conv2d_input(x.shape, w, g, **kw),
        lambda: cpu.conv_weight_grad(xq, gq, w.shape, *args),
        lambda: tgrad.conv2d_weight(x, w.shape, g, **kw),
    ]


def linear_row(name, m, k, n):
    x, w, g = torch.randn(m, k), torch.randn(n, k), torch.randn(m, n)
    xq, wq, gq = _q((m, k), False), _q((n, k), False), _q((m, n), False)
    return name, [
        lambda: cpu.linear_forward(xq, wq),
        lambda: x @ w.t(),
        lambda: cpu.linear_input_grad(gq, wq),
        lambda: g @ w,
        lambda: cpu.linear_weight_grad(xq, gq),
        lambda: g.t() @ x,
    ]


# (cin, cout, hw, k, stride, pad, how many in a CIFAR ResNet-18)
RESNET18_CIFAR = [
    (3, 64, 32, 3, 1, 1, 1),
    (64, 64, 32, 3, 1, 1, 4),
    (64, 128, 32, 3, 2, 1, 1),
    (128, 128, 16, 3, 1, 1, 3),
    (64, 128, 32, 1, 2, 0, 1),
    (128, 256, 16, 3, 2, 1, 1),
    (256, 256, 8, 3, 1, 1, 3),
    (128, 256, 16, 1, 2, 0, 1),
    (256, 512, 8, 3, 2, 1, 1),
    (512, 512, 4, 3, 1, 1, 3),
    (256, 512, 8, 1, 2, 0, 1),
]


def quant_profile(reps: int) -> None:
    """Milliseconds of each quantization step on ResNet-50's largest tensors (batch 32, channels-last)."""
    cl = torch.channels_last
    for what, (n, c, hw, op_name) in {
        "g of 64->256 1x1 (dx, dw)": (32, 256, 56, "int8 op: input grad, 1x1 256->64"),
        "x of 64 3x3 (fwd)": (32, 64, 56, "int8 op: forward, 3x3 64->64"),
    }.items():
        t = torch.randn(n, c, hw, hw).contiguous(memory_format=cl)
        s, sc = cpu.absmax(t), cpu.absmax(t, axis=1)
        _, sigma = cpu.channel_stats(t, 1)
        acc = torch.randint(-(2**20), 2**20, t.shape, dtype=torch.int32).contiguous(memory_format=cl)
        tq = cpu.quantize(t, s)
        if c == 256:
            wq = torch.randint(-127, 128, (256, 64, 1, 1), dtype=torch.int8)
            op = functools.partial(cpu.conv_input_grad, tq, wq, (n, 64, hw, hw))
        else:
            wq = torch.randint(-127, 128, (64, 64, 3, 3), dtype=torch.int8)
            op = functools.partial(cpu.conv_forward, tq, wq, 1, 1)
        fns = {
            "absmax": lambda t=t: cpu.absmax(t),
            "absmax per channel": lambda t=t: cpu.absmax(t, axis=1),
            "quantize nearest": lambda t=t, s=s: cpu.quantize(t, s),
            "quantize stochastic": lambda t=t, s=s: cpu.quantize(t, s, rounding="stochastic"),
            "quantize stochastic per channel": lambda t=t, sc=sc: cpu.quantize(t, sc, 1, "stochastic"),
            "  of which torch.rand alone (the old noise)": lambda t=t: torch.rand(t.shape),
            "channel stats (max, std)": lambda t=t: cpu.channel_stats(t, 1),
            "quantize stochastic + count above sigma": lambda t=t, s=s, sg=sigma: cpu.quantize(
                t, s, None, "stochastic", above=(1, sg)
            ),
            "dequantize (fused epilogue)": lambda a=acc: cpu.dequantize(a, 0.5),
            op_name: op,
        }
        rows = time_round_robin([(name, [fn]) for name, fn in fns.items()], reps)
        print(f"{what}: {tuple(t.shape)} = {t.numel() / 1e6:.1f} M elements; ms, best of {reps}")
        for name, (ms,) in rows:
            print(f"  {name:44s}{ms:9.2f}")


def mobilenet_v2_depthwise(size: int = 112) -> list[tuple[int, int, int, int, int, int]]:
    """(channels, input size, kernel, stride, padding, count) of torchvision's MobileNetV2 depthwise
    convolutions at `size` px, read off the model with forward hooks on the meta device."""
    import torchvision

    model = torchvision.models.mobilenet_v2().to("meta")
    seen: dict = {}

    def hook(mod, inputs, out):
        if mod.groups > 1 and mod.groups == mod.in_channels:
            key = (mod.in_channels, inputs[0].shape[-1], mod.kernel_size[0], mod.stride[0], mod.padding[0])
            seen[key] = seen.get(key, 0) + 1

    for mod in model.modules():
        if isinstance(mod, torch.nn.Conv2d):
            mod.register_forward_hook(hook)
    with torch.no_grad():
        model(torch.zeros((1, 3, size, size), device="meta"))
    return [(*key, n) for key, n in seen.items()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--channels-last", action="store_true", help="activations/gradients channels-last")
    ap.add_argument("--resnet18", action="store_true", help="add a CIFAR ResNet-18 (batch 64) step")
    ap.add_argument("--mobilenet-v2-depthwise", action="store_true", help="add MobileNetV2's depthwise convs")
    ap.add_argument("--quant-profile", action="store_true", help="time the quantization steps instead")
    ap.add_argument("--cpu-time", action="store_true", help="CPU time of this process, not wall time")
    args = ap.parse_args()
    if args.cpu_time:
        global _CLOCK
        _CLOCK = time.process_time
    if args.quant_profile:
        quant_profile(args.reps)
        return
    cl = args.channels_last
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"{'channels-last' if cl else 'contiguous'} activations; ms, best of {args.reps}"
    )
    rows = [
        conv_row("conv3x3 N32 C64 56x56", 32, 64, 64, 56, 3, 1, 1, 1, cl),
        conv_row("conv1x1 N32 256->64 28x28", 32, 256, 64, 28, 1, 1, 0, 1, cl),
        linear_row("linear 256x512 -> 1000", 256, 512, 1000),
    ]
    counts = []
    if args.resnet18:
        for cin, cout, hw, k, s, p, count in RESNET18_CIFAR:
            name = f"r18 {cin}->{cout} {hw}x{hw} k{k}s{s} x{count}"
            rows.append(conv_row(name, 64, cin, cout, hw, k, s, p, 1, cl))
            counts.append(count)
    dw_counts = []
    if args.mobilenet_v2_depthwise:
        for c, hw, k, s, p, count in mobilenet_v2_depthwise():
            rows.append(conv_row(f"mv2 dw {c} {hw}x{hw} k{k}s{s} x{count}", 32, c, c, hw, k, s, p, c, cl))
            dw_counts.append(count)
    rows = time_round_robin(rows, args.reps)
    for label, weights, first in (("r18 convs", counts, 3), ("mv2 depthwise", dw_counts, 3 + len(counts))):
        if weights:
            group = rows[first : first + len(weights)]
            total = [sum(c * t[i] for c, (_, t) in zip(weights, group, strict=True)) for i in range(6)]
            rows.append((f"{label} total (weighted)", total))
    head = ("layer", "fwd i8", "fwd f32", "dx i8", "dx f32", "dw i8", "dw f32", "f32/i8 fwd", "dx", "dw")
    print(f"{head[0]:36s}" + "".join(f"{h:>9s}" for h in head[1:7]) + "".join(f"{h:>11s}" for h in head[7:]))
    for name, t in rows:
        ratios = "".join(f"{t[i + 1] / t[i]:11.2f}" for i in (0, 2, 4))
        print(f"{name:36s}" + "".join(f"{v:9.2f}" for v in t) + ratios)


if __name__ == "__main__":
    main()
