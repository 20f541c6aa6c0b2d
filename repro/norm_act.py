"""BatchNorm and the ReLU / ReLU6 after it as one op in the int8 models, where the backend fuses them.

In a quantized model every BatchNorm2d followed by a ReLU or ReLU6 in the same Sequential (torchvision's
Conv2dNormActivation: MobileNetV2/V3, EfficientNet, RegNet) has its class swapped, as the layers are:
the BatchNorm applies the activation itself, and the activation module passes on a tensor the BatchNorm
already activated. torchvision's ResNet blocks (BasicBlock, Bottleneck: ResNet, ResNeXt, Wide ResNet) call
one ReLU module after each inner BatchNorm and after the residual sum: the block's class is swapped for one
whose forward lets the inner BatchNorms apply the ReLU, and its last BatchNorm (a ResidualBatchNorm2d) the
sum with the shortcut and the ReLU after it; the ReLU module stays for where the backend does not fuse.
RegNet's block (ResBottleneckBlock) is swapped alike: its transform's last BatchNorm takes the sum.
ResNet's stem BatchNorm applies its ReLU, whose module is folded as in a Sequential.

On a backend with fused kernels (kernels.cpu: `norm_act_supported`) a training step then reads and writes
each activation 9 times instead of 18 (kernels/cpu/norm.py), and the int8 convolution next to it takes the
codes written with y instead of quantizing y again. The arithmetic is
BatchNorm's and the activation's (batch mean and biased variance, the running statistics updated as torch
does); the float sums run in another order than torch's, so values differ from torch's in the last bits.
Evaluation, torch.compile, other backends and layouts run the float modules unchanged.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.autograd.function import once_differentiable
from torchvision.models.regnet import ResBottleneckBlock
from torchvision.models.resnet import BasicBlock, Bottleneck, ResNet

import kernels

BOUNDS: dict[type[nn.Module], tuple[float, float]] = {nn.ReLU: (0.0, math.inf), nn.ReLU6: (0.0, 6.0)}


def _fused_backend(x: torch.Tensor):
    """The backend whose fused kernels take x, or None (then the float modules run)."""
    if kernels.compiling():
        return None
    backend = kernels.get_backend(x.device)
    supported = getattr(backend, "norm_act_supported", None)
    return backend if supported is not None and supported(x) else None


class _NormActFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, module, backend):
        running, momentum = module.running_stats_for_kernel()
        lo, hi = module.act_bounds
        y, var, saved = backend.norm_act_forward(x, weight, bias, module.eps, lo, hi, running, momentum)
        if running is None:
            module.update_running_stats(saved.mean, var, x.numel() // x.shape[1])
        ctx.save_for_backward(x, weight)
        ctx.norm_saved, ctx.backend = saved, backend
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, gy):
        x, weight = ctx.saved_tensors
        gx, gw, gb = ctx.backend.norm_act_backward(gy, x, weight, ctx.norm_saved)
        needs = ctx.needs_input_grad
        return gx if needs[0] else None, gw if needs[1] else None, gb if needs[2] else None, None, None


class _ResidualNormActFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, residual, weight, bias, module, backend, handover=None):
        running, momentum = module.running_stats_for_kernel()
        lo, hi = module.act_bounds
        y, var, saved = backend.norm_act_forward(
            x, weight, bias, module.eps, lo, hi, running, momentum, residual
        )
        if running is None:
            module.update_running_stats(saved.mean, var, x.numel() // x.shape[1])
        ctx.save_for_backward(x, weight)  # the activation's mask of y in `saved`, not y (kernels/cpu/norm.py)
        ctx.norm_saved, ctx.backend, ctx.handover = saved, backend, handover
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, gy):
        x, weight = ctx.saved_tensors
        gx, gw, gb, gr = ctx.backend.norm_act_residual_backward(gy, x, weight, ctx.norm_saved)
        needs = ctx.needs_input_grad
        if ctx.handover is not None and needs[1]:
            ctx.handover.grad, gr = gr, None  # added by the block's first convolution (ResidualGrad)
        grads = gx, gr, gw, gb
        return (*(g if need else None for g, need in zip(grads, needs, strict=False)), None, None, None)


class ResidualGrad:
    """The gradient that a ResNet block's last BatchNorm gives the identity shortcut (`grad`, put there by its
    backward pass instead of returned), for the block's first convolution, which has the same input, to add
    to its input gradient where that product is written (kernels.cpu: conv_input_grad's `accumulate`): one
    pass over it instead of the product's and then autograd's add of the two gradients. Bit for bit the same
    sum (float addition is commutative). The fused blocks below hand it over (_shortcut_handover)."""

    __slots__ = ("grad",)

    def __init__(self) -> None:
        self.grad: torch.Tensor | None = None

    def take(self) -> torch.Tensor | None:
        grad, self.grad = self.grad, None
        return grad


def _shortcut_handover(block: nn.Module, conv: nn.Module, x: torch.Tensor) -> ResidualGrad | None:
    """A ResidualGrad for a block whose shortcut is its input x unchanged and whose first convolution `conv`
    reads x, where conv's input gradient can take the shortcut's (an int8 layer without hooks, repro.layers,
    on a backend that adds it in the product), else None (autograd adds the two)."""
    takes = getattr(conv, "takes_residual_grad", None)
    if not (block.training and x.requires_grad and takes is not None and takes()):
        return None
    backend = _fused_backend(x)
    if backend is None or getattr(backend, "accumulating_input_grad", None) is None:
        return None
    return ResidualGrad()


class NormActMixin:
    """A BatchNorm that applies the activation after it (`act_bounds`: clamp to [lo, hi])."""

    act_bounds: tuple[float, float]

    def forward(self, x):
        backend = _fused_backend(x) if self.training else None
        if backend is None:
            return activate(super().forward(x), self.act_bounds)
        if self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
        return _NormActFunction.apply(x, self.weight, self.bias, self, backend)

    def running_stats_for_kernel(self) -> tuple[tuple[torch.Tensor, torch.Tensor] | None, float]:
        """(running mean and variance, momentum) for the fused kernel to update as it finds the batch's
        statistics, or (None, 0.0) where update_running_stats does it (buffers the kernel does not take)."""
        rm, rv = self.running_mean, self.running_var
        if not self.track_running_stats or rm is None or rv is None:
            return None, 0.0
        if any(t.dtype != torch.float32 or not t.is_contiguous() or t.device.type != "cpu" for t in (rm, rv)):
            return None, 0.0
        factor = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
        return (rm, rv), factor

    @torch.no_grad()
    def update_running_stats(self, mean: torch.Tensor, var: torch.Tensor, n: int) -> None:
        """torch's update: an exponential average (momentum, or 1 / batches seen where momentum is None)
        of the batch mean and the unbiased variance."""
        if not self.track_running_stats or self.running_mean is None:
            return
        factor = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
        self.running_mean.mul_(1 - factor).add_(mean.to(self.running_mean.dtype), alpha=factor)
        unbiased = var * (n / max(1, n - 1))
        self.running_var.mul_(1 - factor).add_(unbiased.to(self.running_var.dtype), alpha=factor)


def activate(x: torch.Tensor, bounds: tuple[float, float]) -> torch.Tensor:
    lo, hi = bounds
    return torch.relu(x) if hi == math.inf else torch.clamp(x, lo, hi)


class FusedBatchNorm2d(NormActMixin, nn.BatchNorm2d):
    pass


class ResidualBatchNorm2d(NormActMixin, nn.BatchNorm2d):
    """A ResNet block's last BatchNorm: forward(x) is BatchNorm's alone; add_activate(x, residual, act) is
    act(BatchNorm(x) + residual) as torchvision's block ends, in one op where the backend fuses it."""

    act_bounds = BOUNDS[nn.ReLU]

    def forward(self, x):
        return nn.BatchNorm2d.forward(self, x)

    def add_activate(
        self, x: torch.Tensor, residual: torch.Tensor, act: nn.Module, handover: ResidualGrad | None = None
    ) -> torch.Tensor:
        backend = _fused_backend(x) if self.training else None
        takes = getattr(backend, "norm_act_residual_supported", None)
        if takes is None or not takes(x, residual):
            out = self(x)
            out += residual
            return act(out)
        if self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
        return _ResidualNormActFunction.apply(x, residual, self.weight, self.bias, self, backend, handover)


class FoldedActivation:
    """An activation whose BatchNorm applies it: the identity (the module keeps its class's attributes and
    state_dict; unfuse_norm_activations gives it its class back)."""

    def forward(self, x):
        return x


class FoldedReLU(FoldedActivation, nn.ReLU):
    pass


class FoldedReLU6(FoldedActivation, nn.ReLU6):
    pass


FOLDED = {nn.ReLU: FoldedReLU, nn.ReLU6: FoldedReLU6}


class FusedBasicBlock(BasicBlock):
    """torchvision's BasicBlock.forward with bn1 applying its ReLU (a FusedBatchNorm2d) and bn2 the sum and
    the ReLU after it (a ResidualBatchNorm2d; the shortcut's convolution runs before bn2 instead of after)."""

    def forward(self, x):
        handover = None if self.downsample is not None else _shortcut_handover(self, self.conv1, x)
        out = self.conv1(x) if handover is None else self.conv1.forward_adding_residual_grad(x, handover)
        out = self.conv2(self.bn1(out))
        identity = x if self.downsample is None else self.downsample(x)
        return self.bn2.add_activate(out, identity, self.relu, handover)


class FusedBottleneck(Bottleneck):
    """torchvision's Bottleneck.forward with bn1 and bn2 applying their ReLUs (FusedBatchNorm2d) and bn3 the
    sum and the ReLU after it (a ResidualBatchNorm2d; the shortcut runs before bn3 instead of after)."""

    def forward(self, x):
        handover = None if self.downsample is not None else _shortcut_handover(self, self.conv1, x)
        out = self.conv1(x) if handover is None else self.conv1.forward_adding_residual_grad(x, handover)
        out = self.conv3(self.bn2(self.conv2(self.bn1(out))))
        identity = x if self.downsample is None else self.downsample(x)
        return self.bn3.add_activate(out, identity, self.relu, handover)


class FusedResBottleneckBlock(ResBottleneckBlock):
    """torchvision's RegNet block (ResBottleneckBlock.forward) with f's last BatchNorm, f.c[1], the sum with
    the shortcut and the ReLU after it (a ResidualBatchNorm2d; the projection runs after f instead of
    before). f's inner BatchNorms apply their ReLUs as every Conv2dNormActivation's do."""

    def forward(self, x):
        layers = list(self.f.children())[:-1]  # a, b and se where there is one; c last (_residual_norm)
        a = layers[0] if layers else None
        hooked = a is None or any(
            (a._forward_pre_hooks, a._forward_hooks, a._backward_hooks, a._backward_pre_hooks)
        )
        first = a[0] if isinstance(a, nn.Sequential) and len(a) and not hooked else None  # f.a's convolution
        handover = None if self.proj is not None or first is None else _shortcut_handover(self, first, x)
        out = x
        for i, layer in enumerate(layers):
            if i == 0 and handover is not None:  # f.a's convolution, then the rest of f.a
                out = first.forward_adding_residual_grad(out, handover)
                for rest in list(layer.children())[1:]:
                    out = rest(out)
            else:
                out = layer(out)
        out = self.f.c[0](out)
        identity = x if self.proj is None else self.proj(x)
        return self.f.c[1].add_activate(out, identity, self.activation, handover)


# a block class: (its fused class, the BatchNorms its ReLU follows, the last one (takes the sum), its ReLU)
BLOCKS = {
    BasicBlock: (FusedBasicBlock, ("bn1",), "bn2", "relu"),
    Bottleneck: (FusedBottleneck, ("bn1", "bn2"), "bn3", "relu"),
    # f.a, f.b: Conv2dNormActivation, fused as Sequentials; f.c: (Conv2d, BatchNorm2d) without activation
    ResBottleneckBlock: (FusedResBottleneckBlock, (), "f.c.1", "activation"),
}
UNFUSED_BLOCKS = {fused: block for block, (fused, *_) in BLOCKS.items()}
# a model class whose forward calls a BatchNorm then an activation module used nowhere else: their names
STEMS = {ResNet: ("bn1", "relu")}


def _fuse(norm: nn.Module, act: type[nn.Module]) -> None:
    norm.__class__ = FusedBatchNorm2d
    norm.act_bounds = BOUNDS[act]


def fuse_norm_activations(model: nn.Module) -> int:
    """Swap each exact BatchNorm2d that a ReLU or ReLU6 follows in a Sequential or in a torchvision ResNet
    block; returns how many."""
    parents: dict[int, int] = {}  # an activation module used in two places stays as it is
    for _, m in model.named_modules(remove_duplicate=False):
        for child in m.children():
            parents[id(child)] = parents.get(id(child), 0) + 1
    fused = 0
    for seq in model.modules():
        if not isinstance(seq, nn.Sequential):
            continue
        children = list(seq.children())
        for norm, act in zip(children, children[1:], strict=False):
            if type(norm) is nn.BatchNorm2d and type(act) in BOUNDS and parents[id(act)] == 1:
                _fuse(norm, type(act))
                act.__class__ = FOLDED[type(act)]
                fused += 1
    for stem in model.modules():
        names = STEMS.get(type(stem))
        norm, act = (getattr(stem, name, None) for name in names) if names else (None, None)
        if type(norm) is nn.BatchNorm2d and type(act) in BOUNDS and parents[id(act)] == 1:
            _fuse(norm, type(act))
            act.__class__ = FOLDED[type(act)]
            fused += 1
    for block in model.modules():
        fused_class, names, last, act = BLOCKS.get(type(block), (None, (), None, None))
        if fused_class is None or type(getattr(block, act)) is not nn.ReLU:
            continue
        norms = [block.get_submodule(name) for name in names]
        if not all(type(n) is nn.BatchNorm2d for n in norms) or not _residual_norm(block, last):
            continue
        for norm in norms:
            _fuse(norm, nn.ReLU)
        block.get_submodule(last).__class__ = ResidualBatchNorm2d
        block.__class__ = fused_class
        fused += len(norms) + 1
    return fused


def _residual_norm(block: nn.Module, last: str) -> bool:
    """Whether the block's last BatchNorm is a plain one, and in a RegNet block the last of f.c's two."""
    if type(block.get_submodule(last)) is not nn.BatchNorm2d:
        return False
    if isinstance(block, ResBottleneckBlock):  # f.c must be the convolution and this BatchNorm alone
        return len(block.f.c) == 2 and list(block.f.named_children())[-1][0] == "c"
    return True


def unfuse_norm_activations(model: nn.Module) -> None:
    """Back to the float classes (before another method's quantize_model, or none)."""
    for m in model.modules():
        if type(m) in UNFUSED_BLOCKS:
            m.__class__ = UNFUSED_BLOCKS[type(m)]
        if isinstance(m, FusedBatchNorm2d):
            m.__class__ = nn.BatchNorm2d
            del m.act_bounds
        elif isinstance(m, ResidualBatchNorm2d):
            m.__class__ = nn.BatchNorm2d
        elif isinstance(m, FoldedActivation):
            m.__class__ = next(c for c in type(m).__mro__[1:] if c in BOUNDS)
