"""Quantized layers and the one layer registry: `quantize_model` swaps layers in place.

A quantized layer is the original module with its class swapped (as torchao's module_swap does): the
same nn.Parameter objects and the same state_dict keys, so a swap after the optimizer, a DDP wrapper or
a checkpoint exist is safe. Its forward runs one autograd Function per op family that asks the layer's
method for int8 operands and the backend (kernels.get_backend; under torch.compile kernels.traceable,
whose products are registered ops) for exact int32 products:

    Y  = acc(q(X), q(W))          * (s_x / 127)(s_w / 127) + b
    GX = acc^T(q_gx(G), q(W))     * (s_gx / 127)(s_w / 127)
    GW = acc(q(X), q_gw(G))       * (s_x / 127)(s_gw / 127)   (s_gw per tensor or per output channel)
    Gb = sum of the float G (the bias stays float)
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import kernels
from kernels.errors import clear_nonfinite
from repro.methods import LayerQuantizer, Method, build_method
from repro.norm_act import ResidualGrad, fuse_norm_activations, unfuse_norm_activations
from repro.quant import QMAX

QUANTIZABLE = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear)


def _memory_format(x: torch.Tensor) -> torch.memory_format:
    """The layout torch's own convolution gives its output for input x (channels-last stays so)."""
    if x.is_contiguous():  # also every tensor contiguous in both layouts (C = 1, or 1x1 maps)
        return torch.contiguous_format
    if x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last):
        return torch.channels_last
    if x.dim() == 5 and x.is_contiguous(memory_format=torch.channels_last_3d):
        return torch.channels_last_3d
    return torch.contiguous_format


def _out_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype torch's own op would return: the autocast dtype inside torch.autocast, else x's."""
    kind = x.device.type
    if torch.amp.is_autocast_available(kind) and torch.is_autocast_enabled(kind):
        return torch.get_autocast_dtype(kind)
    return x.dtype


def _epilogue(backend, acc, scale, dtype, fmt, axis=None) -> torch.Tensor:
    """acc * scale by the backend's dequantizing epilogue, as `dtype`, laid out as `fmt` (None: as the
    backend returned it, channels-last).

    The backends' products come back channels-last whatever the input. Passed on as they are, they reach
    ops that read raw NCHW memory without checking the layout: mmcv's CPU RoIAlign then pools the wrong
    pixels (a trained Faster R-CNN fell from mAP 53 to 0.2 with int8 layers, measured).
    """
    out = backend.dequantize(acc, scale, axis, dtype, inplace=True)
    out = out if out.dtype == dtype else out.to(dtype)
    return out if fmt is None else out.contiguous(memory_format=fmt)


def conv_epilogue(backend, product, args, scale, dtype, fmt) -> torch.Tensor:
    """backend.<product>(*args) dequantized as _epilogue does. Where the backend's products write the
    scaled result themselves (kernels.cpu: float32, and bfloat16 under autocast; the epilogue without its
    pass over the output, bit for bit the same values), they do."""
    fused = getattr(backend, "epilogue_in_products", None)
    if (
        fused is not None
        and fused()
        and dtype in getattr(backend, "epilogue_dtypes", lambda: (torch.float32,))()
    ):
        kwargs = {"out_scale": scale} if dtype == torch.float32 else {"out_scale": scale, "out_dtype": dtype}
        out = getattr(backend, product)(*args, **kwargs)
        return out if fmt is None else out.contiguous(memory_format=fmt)
    return _epilogue(backend, getattr(backend, product)(*args), scale, dtype, fmt)


def weight_grad_epilogue(backend, args, scale, dtype, axis) -> torch.Tensor:
    """backend.conv_weight_grad(*args) dequantized as _epilogue does (`axis` 0: one scale per output
    channel). Where the backend's products write the scaled float32 result themselves (kernels.cpu: bit for
    bit the same values, without the epilogue's pass over the gradient), they do."""
    fused = getattr(backend, "epilogue_in_products", None)
    if fused is not None and fused() and dtype == torch.float32:
        return backend.conv_weight_grad(*args, out_scale=scale)
    return _epilogue(backend, backend.conv_weight_grad(*args), scale, dtype, None, axis=axis)


def _op_geometry(geometry) -> tuple[list[int], list[int], list[int], int]:
    """(stride, padding, dilation, groups) as the custom ops' schema takes them (lists, not tuples)."""
    stride, padding, dilation, groups = geometry
    return list(stride), list(padding), list(dilation), groups


def _weight_grad_scale(codes, sx: torch.Tensor) -> torch.Tensor:
    """GW's scale: (s_x/127)(s_c/127) per output channel (GVQ, DAIQ eq. 7) or (s_x/127)(s_g/127)."""
    return codes.gw_scale * (sx / QMAX**2)


def input_grad_epilogue(backend, args, scale, dtype, fmt, residual: torch.Tensor | None) -> torch.Tensor:
    """conv_epilogue of conv_input_grad, plus `residual` (None: nothing) as autograd would add it: in the
    product where the backend accumulates into a float32 gradient (`accumulating_input_grad`), else after."""
    if residual is None:
        return conv_epilogue(backend, "conv_input_grad", args, scale, dtype, fmt)
    takes = getattr(backend, "accumulating_input_grad", None)
    if takes is not None and takes(residual, dtype):
        gx = backend.conv_input_grad(*args, out_scale=scale, accumulate=residual)
        return gx if fmt is None else gx.contiguous(memory_format=fmt)
    gx = conv_epilogue(backend, "conv_input_grad", args, scale, dtype, fmt)
    return residual + gx


class _Int8ConvFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, layer, geometry, quantizer: LayerQuantizer, residual=None):
        backend = kernels.get_backend(x.device)
        xq, sx = quantizer.activation(x)
        wq, sw = quantizer.weight(weight)
        dtype = _out_dtype(x)
        # torch's convolution gives its output the input's layout; channels_last_out keeps the backend's
        ctx.x_format = None if layer.channels_last_out else _memory_format(x)
        args = (xq, wq, *_op_geometry(geometry))
        out = conv_epilogue(backend, "conv_forward", args, sx * sw / QMAX**2, dtype, ctx.x_format)
        if bias is not None:
            out += bias.detach().to(dtype).reshape(1, -1, *([1] * (x.dim() - 2)))
        ctx.save_for_backward(xq, wq, sx, sw)
        ctx.quantizer, ctx.geometry, ctx.x_shape, ctx.has_bias = (
            quantizer,
            geometry,
            x.shape,
            bias is not None,
        )
        ctx.x_dtype, ctx.w_dtype = x.dtype, weight.dtype
        ctx.residual = residual  # a ResidualGrad (ResNet blocks, repro.norm_act), or None
        return out

    @staticmethod
    def backward(ctx, gy):
        xq, wq, sx, sw = ctx.saved_tensors
        backend = kernels.get_backend(gy.device)
        codes = ctx.quantizer.grad(gy, channel_axis=1)
        gx = gw = gb = None
        if ctx.needs_input_grad[0]:
            args = (codes.gx, wq, list(ctx.x_shape), *_op_geometry(ctx.geometry))
            residual = None if ctx.residual is None else ctx.residual.take()
            # in x's layout too: custom ops' backward read their output gradient's memory the same way
            gx = input_grad_epilogue(backend, args, codes.gx_scale * sw / QMAX**2, gy.dtype, ctx.x_format,
                                     residual)  # fmt: skip
        if ctx.needs_input_grad[1]:
            args = (xq, codes.gw, list(wq.shape), *_op_geometry(ctx.geometry))
            gw = weight_grad_epilogue(backend, args, _weight_grad_scale(codes, sx), ctx.w_dtype,
                                      0 if codes.gw_per_channel else None)  # fmt: skip
        if ctx.has_bias and ctx.needs_input_grad[2]:
            gb = gy.sum(dim=[d for d in range(gy.dim()) if d != 1])
        return gx, gw, gb, None, None, None, None


class _Int8LinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, quantizer: LayerQuantizer):
        backend = kernels.get_backend(x.device)
        x2 = x.reshape(-1, x.shape[-1])
        xq, sx = quantizer.activation(x2)
        wq, sw = quantizer.weight(weight)
        dtype = _out_dtype(x)
        out = _epilogue(backend, backend.linear_forward(xq, wq), sx * sw / QMAX**2, dtype, None)
        if bias is not None:
            out += bias.detach().to(dtype)
        ctx.save_for_backward(xq, wq, sx, sw)
        ctx.quantizer, ctx.x_shape, ctx.has_bias, ctx.w_dtype = (
            quantizer,
            x.shape,
            bias is not None,
            weight.dtype,
        )
        # Never a view: a view returned from a custom Function cannot be modified in place, and callers
        # do that (mmdet's bbox heads: relu(fc(x), inplace=True)).
        shape = (*x.shape[:-1], weight.shape[0])
        return out if out.shape == shape else out.reshape(shape).clone()

    @staticmethod
    def backward(ctx, gy):
        xq, wq, sx, sw = ctx.saved_tensors
        backend = kernels.get_backend(gy.device)
        g2 = gy.reshape(-1, gy.shape[-1])
        codes = ctx.quantizer.grad(g2, channel_axis=1)
        gx = gw = gb = None
        if ctx.needs_input_grad[0]:
            acc = backend.linear_input_grad(codes.gx, wq)
            gx = _epilogue(backend, acc, codes.gx_scale * sw / QMAX**2, gy.dtype, None).reshape(ctx.x_shape)
        if ctx.needs_input_grad[1]:
            acc = backend.linear_weight_grad(xq, codes.gw)
            gw = _epilogue(backend, acc, _weight_grad_scale(codes, sx), ctx.w_dtype, None,
                           axis=0 if codes.gw_per_channel else None)  # fmt: skip
        if ctx.has_bias and ctx.needs_input_grad[2]:
            gb = g2.sum(dim=0)
        return gx, gw, gb, None


def conv_geometry(conv: nn.modules.conv._ConvNd) -> tuple[tuple, tuple, tuple, int] | None:
    """(stride, padding, dilation, groups) with explicit zero padding, or None if not expressible."""
    padding = conv.padding
    if padding == "valid":
        padding = (0,) * len(conv.kernel_size)
    elif padding == "same":
        totals = [d * (k - 1) for d, k in zip(conv.dilation, conv.kernel_size, strict=True)]
        if any(t % 2 for t in totals):  # asymmetric 'same' padding has no symmetric equivalent
            return None
        padding = tuple(t // 2 for t in totals)
    return tuple(conv.stride), tuple(padding), tuple(conv.dilation), conv.groups


class Int8Layer:
    """Mixin of every quantized layer class; `int8` is the layer's LayerQuantizer.

    With per-call state (quantize_model(per_call_state=True)) a layer called several times in one forward
    pass (a detector head shared by every FPN level) gets one LayerQuantizer per call, `int8_calls`, the
    first of them `int8`; the model's forward pre-hook resets the call count.
    """

    int8: LayerQuantizer
    int8_calls: list[LayerQuantizer] | None = None
    _int8_call = 0

    def _quantizer(self) -> LayerQuantizer:
        if self.int8_calls is None:
            return self.int8
        i = self._int8_call
        self._int8_call = i + 1
        while len(self.int8_calls) <= i:
            self.int8_calls.append(self.int8.method.make_layer_quantizer())
        return self.int8_calls[i]


class Int8Conv(Int8Layer):
    # False: outputs and input gradients in the input's layout, as torch's convolution (safe for any
    # consumer). True: left channels-last as the backends return them, whatever the input's layout: no
    # layout copy per layer (the copies made a DAIQ step on NCHW input 11% slower for ResNet-50, 0-7% for
    # ResNet-18, measured), for models whose every op accepts any strides, as torch's own do.
    # quantize_model(channels_last_out=...) sets it per layer.
    channels_last_out = False

    def forward(self, x):
        if not self.int8.quantizes:
            return super().forward(x)
        if self.int8.simulated:
            return self.int8.simulate(x, self.weight, lambda x, w: self._conv_forward(x, w, self.bias))
        return _Int8ConvFunction.apply(
            x, self.weight, self.bias, self, conv_geometry(self), self._quantizer()
        )

    def takes_residual_grad(self) -> bool:
        """Whether forward_adding_residual_grad may stand for forward: a real int8 product, and no hooks,
        which could replace the input or see the input gradient with the shortcut's added."""
        nn_module = torch.nn.modules.module
        hooks = (self._forward_pre_hooks, self._forward_hooks, self._backward_hooks, self._backward_pre_hooks)
        global_hooks = (nn_module._global_forward_pre_hooks, nn_module._global_forward_hooks,
                        nn_module._global_backward_hooks, nn_module._global_backward_pre_hooks)  # fmt: skip
        return self.int8.quantizes and not self.int8.simulated and not any(hooks) and not any(global_hooks)

    def forward_adding_residual_grad(self, x, residual: ResidualGrad):
        """forward(x) whose input gradient is returned plus residual.grad where the backward pass finds one
        there (takes_residual_grad must hold)."""
        return _Int8ConvFunction.apply(
            x, self.weight, self.bias, self, conv_geometry(self), self._quantizer(), residual
        )


class Int8LinearMixin(Int8Layer):
    def forward(self, x):
        if not self.int8.quantizes:
            return super().forward(x)
        if self.int8.simulated:
            return self.int8.simulate(x, self.weight, lambda x, w: F.linear(x, w, self.bias))
        return _Int8LinearFunction.apply(x, self.weight, self.bias, self._quantizer())


class Int8Conv1d(Int8Conv, nn.Conv1d):
    pass


class Int8Conv2d(Int8Conv, nn.Conv2d):
    pass


class Int8Conv3d(Int8Conv, nn.Conv3d):
    pass


class Int8Linear(Int8LinearMixin, nn.Linear):
    pass


# The layer registry: float class -> quantized class. Subclasses of these (e.g. mmcv's wrappers) get a
# quantized class made on first use, so their own methods stay.
LAYER_REGISTRY: dict[type[nn.Module], type[nn.Module]] = {
    nn.Conv1d: Int8Conv1d,
    nn.Conv2d: Int8Conv2d,
    nn.Conv3d: Int8Conv3d,
    nn.Linear: Int8Linear,
}


def quantized_class(cls: type[nn.Module]) -> type[nn.Module]:
    if cls not in LAYER_REGISTRY:
        mixin = Int8LinearMixin if issubclass(cls, nn.Linear) else Int8Conv
        LAYER_REGISTRY[cls] = type(f"Int8{cls.__name__}", (mixin, cls), {"__module__": __name__})
    return LAYER_REGISTRY[cls]


def unsupported_reason(module: nn.Module) -> str | None:
    if isinstance(module, nn.modules.conv._ConvNd):
        if module.padding_mode != "zeros":
            return f"padding_mode={module.padding_mode!r} (the int8 backends pad with zeros only)"
        if conv_geometry(module) is None:
            return "padding='same' with an even kernel extent (asymmetric padding)"
    if not module.weight.is_floating_point():
        return f"weight dtype {module.weight.dtype}"
    return None


def float_class(module: nn.Module) -> type[nn.Module]:
    cls = type(module)
    if isinstance(module, Int8Layer):
        return next(c for c in cls.__mro__[1:] if c in LAYER_REGISTRY and not issubclass(c, Int8Layer))
    return cls


def quantizable_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Every Conv1d/2d/3d and Linear (quantized or not), in registration order."""
    return [(name, m) for name, m in model.named_modules() if isinstance(m, QUANTIZABLE)]


def quantized_layers(model: nn.Module) -> dict[str, nn.Module]:
    return {name: m for name, m in model.named_modules() if isinstance(m, Int8Layer)}


def resolve_skip(layers: list[tuple[str, nn.Module]], skip) -> set[str]:
    """Names to leave in float: "first"/"last" (of the quantizable layers), or module names/prefixes."""
    if isinstance(skip, str):
        skip = (skip,)
    names = [n for n, _ in layers]
    chosen: set[str] = set()
    for item in skip or ():
        if item == "first" and names:
            chosen.add(names[0])
        elif item == "last" and names:
            chosen.add(names[-1])
        else:
            matched = [n for n in names if n == item or n.startswith(item + ".")]
            if not matched and item not in ("first", "last"):
                raise ValueError(
                    f"skip entry {item!r} names no Conv/Linear layer; layers: {', '.join(names)}"
                )
            chosen.update(matched)
    return chosen


def quantize_model(
    model: nn.Module,
    method: str | Method,
    skip=("first", "last"),
    channels_last_out: bool = False,
    per_call_state: bool = False,
    fuse_norm: bool = True,
    **method_options: Any,
) -> nn.Module:
    """Swap every Conv1d/2d/3d and Linear of `model` (but the skipped) for its INT8 class, in place.

    Each swapped layer gets its own state from `method` (a registered name, see list_methods(), or a
    Method). Returns the model. Layers the backends cannot run stay float, with one warning each.
    `channels_last_out`: convolutions leave outputs and input gradients channels-last (Int8Conv).
    `per_call_state`: a layer called several times per forward pass gets one method state per call
    (Int8Layer), instead of one state for all its calls.
    `fuse_norm`: each BatchNorm2d with a ReLU / ReLU6 after it in a Sequential runs as one op with it
    (repro.norm_act), unless the method swaps BatchNorm itself (WAGEUBN).
    """
    method = build_method(method, **method_options)
    layers = quantizable_layers(model)
    skipped = resolve_skip(layers, skip)
    for name, module in layers:
        if name in skipped:
            if isinstance(module, Int8Layer):
                module.__class__ = float_class(module)
                del module.int8
                module.__dict__.pop("channels_last_out", None)
            continue
        reason = unsupported_reason(module)
        if reason is not None:
            warnings.warn(f"layer {name or type(module).__name__!r} stays float: {reason}", stacklevel=2)
            continue
        module.__class__ = quantized_class(float_class(module))
        module.int8 = method.make_layer_quantizer()
        module.int8_calls = [module.int8] if per_call_state else None
        if isinstance(module, Int8Conv):
            module.channels_last_out = channels_last_out
    swap_modules(model, method)
    unfuse_norm_activations(model)
    if fuse_norm and nn.BatchNorm2d not in method.module_swaps():
        fuse_norm_activations(model)
    if not hasattr(model, "_int8_forward_hook"):
        model._int8_forward_hook = model.register_forward_pre_hook(_new_forward_pass)
    return model


def _new_forward_pass(model: nn.Module, *_) -> None:
    """As a forward pass starts: a GPU quantizer's NaN/Inf flag covers one iteration (a mixed-precision
    step that GradScaler skipped leaves it set, and is no divergence); per-call states count calls anew."""
    clear_nonfinite()
    for m in model.modules():
        if isinstance(m, Int8Layer) and m.int8_calls is not None:
            m._int8_call = 0


def layer_quantizers(layer: nn.Module) -> list[LayerQuantizer]:
    """The LayerQuantizers of a quantized layer: one, or one per call with per-call state."""
    return list(layer.int8_calls) if layer.int8_calls is not None else [layer.int8]


def swap_modules(model: nn.Module, method: Method) -> None:
    """The method's other module swaps (Method.module_swaps, e.g. WAGEUBN's BatchNorm and ReLU), in place,
    everywhere in the model; a module swapped earlier by another method goes back to its float class."""
    swaps = method.module_swaps()
    for module in model.modules():
        if hasattr(module, "int8_method"):
            module.__class__ = next(
                c for c in type(module).__mro__[1:] if c in module.int8_method.module_swaps()
            )
            del module.int8_method
        if type(module) in swaps:
            module.__class__ = swaps[type(module)]
            module.int8_method = method


def method_state_dict(model: nn.Module) -> dict[str, dict[str, Any]]:
    """Every quantized layer's method state (DAIQ's s_c, UI8's c and d_c, step counts) by layer name; with
    per-call state, {"calls": [one state per call]}."""
    return {
        name: m.int8.state_dict()
        if m.int8_calls is None
        else {"calls": [q.state_dict() for q in m.int8_calls]}
        for name, m in quantized_layers(model).items()
    }


def load_method_state_dict(model: nn.Module, state: dict[str, dict[str, Any]]) -> None:
    layers = quantized_layers(model)
    missing, unexpected = sorted(set(layers) - set(state)), sorted(set(state) - set(layers))
    if missing or unexpected:
        raise KeyError(f"method state does not match the model: missing {missing}, unexpected {unexpected}")
    for name, layer in layers.items():
        entry = state[name]
        if "calls" not in entry:
            layer.int8.load_state_dict(entry)
            continue
        if layer.int8_calls is None:
            raise KeyError(
                f"method state of layer {name!r} has one state per call; the model has one per layer"
            )
        layer.int8_calls[:] = [layer.int8]
        for i, call_state in enumerate(entry["calls"]):
            layer._int8_call = i
            layer._quantizer().load_state_dict(call_state)
        layer._int8_call = 0
