"""The statistics recorder: activations, weights and gradients of chosen layers at chosen iterations,
before and after their quantizers, summarised as the papers' figures need them.

    recorder = StatsRecorder(model, layers=["features.9.conv.2"], paths=("A", "W", "G"), every=10)
    for it, (x, y) in enumerate(loader):
        with recorder.iteration(it):          # records only where recorder.wants(it)
            loss = criterion(model(x), y)
            loss.backward()
        optimizer.step()
    recorder.records, recorder.samples        # or recorder.save(folder)

`StatsRecorderHook` (repro.hooks) does the same inside an MMEngine Runner and adds the training curves.

Paths, per module (`layers`: module names or fnmatch patterns; None: every quantized Conv/Linear):
    A   a Conv/Linear layer's input activation (a WAGEUBN ReLU's output)
    W   its weight
    G   the gradient of its output: UI8's g, DAIQ's G, WAGEUBN's e_l3 (the error between conv and BN)
    GW  its weight gradient (float and simulated layers: an int8 layer computes it from int8 operands)
    BN  a WAGEUBN BatchNorm's x_hat;  E1  the error entering a WAGEUBN ReLU (e_l0)
"Quantized" is what the layer computed with: the int8 codes the method made (dequantized), the
simulated operands, or for the WAGEUBN modules their own quantizers (`observe_forward/_backward`). Float
layers (fp32) have no quantized side; `compare` applies other quantizers (COMPARISONS) to the float values.

Each record holds, for the float values and the quantized ones: n, mean, std, max|x|, the nonzero ratio
and P(|x| > sigma), a histogram over [-max|x|, max|x|]; d_c (UI8 eq. 7) and DAIQ's E (eq. 8,
alpha = 0.2) between them; optionally the KS statistics against fitted Gaussian / Laplace / Student-t
(`ks`), DAIQ's D_n of the Inverted-T and of a Gaussian (`dn`, G only), per-channel and per-sample histograms
(`slices`, G only) and d_c against the clip value (`clip_curve`, G only). Samples are bounded: each
record keeps a uniform random subsample of at most `sample_size` values (its own generator, so torch's
random state is untouched), and the KS and D_n statistics are computed on it.

Costs nothing when off: between recorded iterations no hook is installed. Changes no gradient: hooks read
tensors and compute on copies, no quantizer is called again with stochastic rounding, and no random
number is drawn from torch's generators (tests/test_recorder.py: a run with it equals a run without).
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import math
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from atomic_files import write_file
from repro import stats
from repro.layers import QUANTIZABLE, Int8Layer, layer_quantizers, quantized_layers
from repro.methods.ui8 import cosine_distance_tensor
from repro.methods.wageubn.fixed_point import SQ, flag_qe2
from repro.quant import QMAX, dequantize

PATHS = ("A", "W", "G", "GW", "BN", "E1")
CLIP_RATIOS = tuple(2.0 ** (-k / 4) for k in range(40, -1, -1))  # c / max|g| from 2^-10 to 1


def _int8_nearest(x: torch.Tensor) -> torch.Tensor:
    s = x.detach().abs().max().clamp_min(torch.finfo(torch.float32).tiny)
    return (x * (QMAX / s)).round().clamp(-QMAX, QMAX) * (s / QMAX)


# Other quantizers to apply to the float values (deterministic: none draws a random number).
COMPARISONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "int8": _int8_nearest,  # per-tensor max|x|, nearest rounding
    "shift8": lambda e: SQ(e, 8),  # WAGEUBN's 8-bit QE2 (eq. 16)
    "shift16": lambda e: SQ(e, 16),
    "flag8": lambda e: flag_qe2(e, 8),  # WAGEUBN's 8-bit Flag QE2 (eq. 17)
}


class StatsRecorder:
    def __init__(
        self,
        model: nn.Module,
        layers: Iterable[str] | None = None,
        paths: Iterable[str] = ("A", "W", "G"),
        iterations: Iterable[int] | None = None,
        every: int | None = None,
        sample_size: int = 4096,
        bins: int = 101,
        ks: bool | Iterable[str] = False,
        dn: bool = False,
        slices: int = 0,
        clip_curve: bool = False,
        compare: Iterable[str] = (),
        seed: int = 0,
    ):
        self.model = model
        self.paths = tuple(paths)
        unknown = [p for p in self.paths if p not in PATHS]
        if unknown:
            raise ValueError(f"unknown path {unknown[0]!r}; choose from {', '.join(PATHS)}")
        self.compare = tuple(compare)
        bad = [c for c in self.compare if c not in COMPARISONS]
        if bad:
            raise ValueError(f"unknown comparison {bad[0]!r}; choose from {', '.join(COMPARISONS)}")
        self.iterations = None if iterations is None else {int(i) for i in iterations}
        self.every = every
        if self.iterations is None and not every:
            raise ValueError("say when to record: iterations=[...] or every=N")
        self.sample_size, self.bins, self.slices = int(sample_size), int(bins), int(slices)
        self.ks_paths = set(self.paths if ks is True else () if ks is False else ks)
        self.dn, self.clip_curve, self.seed = dn, clip_curve, seed
        self.modules = self._resolve(layers)
        self.records: list[dict[str, Any]] = []
        self.samples: dict[str, np.ndarray] = {}
        self._handles: list[Any] = []
        self._patched: list[tuple[Any, str]] = []
        self._pending: dict[tuple[str, str], torch.Tensor] = {}
        self._calls: dict[tuple[str, str], int] = {}
        self._iteration: int | None = None

    # -------------------------------------------------------------------------------- when and where
    def _resolve(self, layers) -> dict[str, nn.Module]:
        named = dict(self.model.named_modules())
        if layers is None:
            floats = {n: m for n, m in named.items() if isinstance(m, QUANTIZABLE)}
            return quantized_layers(self.model) or floats
        out: dict[str, nn.Module] = {}
        for pattern in [layers] if isinstance(layers, str) else layers:
            hits = [n for n in named if n and fnmatch.fnmatchcase(n, pattern)]
            if not hits:
                raise ValueError(f"layer {pattern!r} names no module of the model")
            out.update((n, named[n]) for n in hits)
        return out

    def wants(self, iteration: int) -> bool:
        if self.iterations is not None:
            return iteration in self.iterations
        return iteration % self.every == 0

    @contextlib.contextmanager
    def iteration(self, iteration: int):
        """Record the forward and backward passes inside (if `wants(iteration)`)."""
        self.start(iteration)
        try:
            yield self
        finally:
            self.stop()

    def start(self, iteration: int) -> None:
        if self._iteration is not None or not self.wants(iteration):
            return
        self._iteration = iteration
        for name, module in self.modules.items():
            self._arm(name, module)

    def stop(self) -> None:
        """Remove every hook and patch; a float value whose quantized side never came is recorded alone."""
        for handle in self._handles:
            handle.remove()
        for obj, attr in self._patched:
            obj.__dict__.pop(attr, None)
        self._handles, self._patched = [], []
        for (name, path), x in list(self._pending.items()):
            self._record(name, path, x, None)
        self._pending, self._calls = {}, {}
        self._iteration = None

    # ----------------------------------------------------------------------------------- the probes
    def _arm(self, name: str, module: nn.Module) -> None:
        if isinstance(module, QUANTIZABLE):
            quantizers = layer_quantizers(module) if isinstance(module, Int8Layer) else []
            if quantizers and quantizers[0].quantizes and not quantizers[0].simulated:
                for q in quantizers:
                    self._patch_int8(name, q)
            elif quantizers and quantizers[0].quantizes:
                for q in quantizers:
                    self._patch_simulated(name, q)
            else:
                self._hook_float(name, module)
        elif hasattr(module, "observe_forward") or hasattr(module, "observe_backward"):
            self._hook_observed(name, module)

    def _patch(self, obj: Any, attr: str, wrapper) -> None:
        obj.__dict__[attr] = wrapper  # an instance attribute shadows the method until stop() pops it
        self._patched.append((obj, attr))

    def _patch_int8(self, name: str, q) -> None:
        method = type(q)

        def activation(x):
            xq, s = method.activation(q, x)
            if "A" in self.paths:
                self._record(name, "A", x, dequantize(xq, s))
            return xq, s

        def weight(w):
            wq, s = method.weight(q, w)
            if "W" in self.paths:
                self._record(name, "W", w, dequantize(wq, s))
            return wq, s

        def grad(g, channel_axis):
            codes = method.grad(q, g, channel_axis)
            if "G" in self.paths:
                gx = dequantize(codes.gx, codes.gx_scale)
                gw = None
                if codes.gw is not codes.gx:
                    gw = dequantize(codes.gw, codes.gw_scale, channel_axis if codes.gw_per_channel else None)
                self._record(name, "G", g, gx, gw=gw, quantizer=q)
            return codes

        self._patch(q, "activation", activation)
        self._patch(q, "weight", weight)
        self._patch(q, "grad", grad)

    def _patch_simulated(self, name: str, q) -> None:
        method = type(q)

        def simulate(x, weight, op):
            def observed(xo, wo):
                y = op(xo, wo)
                if "A" in self.paths:
                    self._record(name, "A", x, xo)
                if "W" in self.paths:
                    self._record(name, "W", weight, wo)
                if "G" in self.paths and y.requires_grad:
                    y.register_hook(lambda gq: self._complete(name, "G", gq))
                if "GW" in self.paths and wo.requires_grad:
                    wo.register_hook(lambda g: self._hold(name, "GW", g))
                return y

            out = method.simulate(q, x, weight, observed)
            if "G" in self.paths and out.requires_grad:
                out.register_hook(lambda g: self._hold(name, "G", g))
            if "GW" in self.paths and weight.requires_grad:
                self._handles.append(weight.register_hook(lambda gq: self._complete(name, "GW", gq)))
            return out

        self._patch(q, "simulate", simulate)

    def _hook_float(self, name: str, module: nn.Module) -> None:
        def forward(mod, inputs, output):
            if "A" in self.paths:
                self._record(name, "A", inputs[0], None)
            if "W" in self.paths:
                self._record(name, "W", mod.weight, None)
            if "G" in self.paths and output.requires_grad:
                output.register_hook(lambda g: self._record(name, "G", g, None))

        self._handles.append(module.register_forward_hook(forward))
        if "GW" in self.paths and module.weight.requires_grad:
            self._handles.append(module.weight.register_hook(lambda g: self._record(name, "GW", g, None)))

    def _hook_observed(self, name: str, module: nn.Module) -> None:
        def forward(mod, inputs, output):
            if hasattr(mod, "observe_forward"):
                for path, (x, xq) in mod.observe_forward(inputs, output).items():
                    if path in self.paths:
                        self._record(name, path, x, xq)
            if hasattr(mod, "observe_backward") and output.requires_grad:
                output.register_hook(lambda e: self._observe_backward(name, mod, e))

        self._handles.append(module.register_forward_hook(forward))

    def _observe_backward(self, name: str, module: nn.Module, e: torch.Tensor) -> None:
        for path, (x, xq) in module.observe_backward(e).items():
            if path in self.paths:
                self._record(name, path, x, xq)

    def _hold(self, name: str, path: str, x: torch.Tensor) -> None:
        self._pending[(name, path)] = x.detach()

    def _complete(self, name: str, path: str, xq: torch.Tensor) -> None:
        x = self._pending.pop((name, path), None)
        if x is not None:
            self._record(name, path, x, xq)

    # --------------------------------------------------------------------------------- the record
    @torch.no_grad()
    def _record(self, name, path, x, xq, gw=None, quantizer=None) -> None:
        x = x.detach()
        call = self._calls.get((name, path), 0)  # a module run twice per pass (a block's one ReLU)
        self._calls[(name, path)] = call + 1
        rec: dict[str, Any] = {"iteration": self._iteration, "layer": name, "path": path, "call": call,
                               "shape": list(x.shape), **stats.summary(x)}  # fmt: skip
        limit = rec["absmax"]
        rec["hist"] = stats.histogram(x, self.bins, limit)
        if xq is not None:
            xq = xq.detach().reshape(x.shape).to(x.dtype)
            rec["quant"] = self._versus(x, xq, limit)
        if gw is not None:
            rec["quant_gw"] = self._versus(x, gw.reshape(x.shape), limit)
        for c in self.compare:
            rec.setdefault("compare", {})[c] = self._versus(x, COMPARISONS[c](x), limit)
        if path == "G" and self.slices and x.dim() >= 2:
            for key, axis in (("channels", 1), ("samples", 0)):
                per_slice = x.numel() // max(1, x.shape[axis])
                bins = min(
                    self.bins, max(11, 2 * math.isqrt(per_slice) + 1)
                )  # ~2 sqrt(n): few values, few bins
                rec[key] = stats.slice_histograms(x, axis, self.slices, bins)
        if path == "G" and self.clip_curve:
            rec["clip_curve"] = {
                "ratio": list(CLIP_RATIOS),
                "d_c": [float(cosine_distance_tensor(x, r * limit)) for r in CLIP_RATIOS],
            }
        if quantizer is not None:
            rec["method"] = _scalars(quantizer.state_dict())
            rec["method"]["lr_scale"] = float(quantizer.lr_scale())
        self._keep_sample(rec, x, xq)
        self.records.append(rec)

    def _versus(self, x: torch.Tensor, xq: torch.Tensor, limit: float) -> dict[str, Any]:
        return {
            **stats.summary(xq),
            "hist": stats.histogram(xq, self.bins, limit),
            "d_c": stats.cosine_distance(x, xq),
            "E": stats.daiq_error(x, xq),
        }

    def _keep_sample(self, rec: dict[str, Any], x: torch.Tensor, xq: torch.Tensor | None) -> None:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + len(self.records))
        idx = stats.subsample(x.numel(), self.sample_size, generator, x.device)
        flat = x.reshape(-1)
        sample = (flat if idx is None else flat[idx]).float().cpu()
        key = f"{rec['iteration']}|{rec['layer']}|{rec['path']}|{rec['call']}"
        rec["sample"] = {"key": key, "n": int(sample.numel()), "of": int(x.numel()),
                         "how": "all values" if idx is None else "uniform random subsample"}  # fmt: skip
        self.samples[f"{key}|float"] = sample.numpy()
        if xq is not None:
            qflat = xq.reshape(-1)
            self.samples[f"{key}|quant"] = (qflat if idx is None else qflat[idx]).float().cpu().numpy()
        if rec["path"] in self.ks_paths:
            rec["ks"] = stats.ks_fits(sample.numpy())
        if self.dn and rec["path"] == "G":
            rec["dn"] = stats.dn_fits(sample.numpy())

    # ----------------------------------------------------------------------------------- output
    def config(self) -> dict[str, Any]:
        return {
            "layers": list(self.modules),
            "paths": list(self.paths),
            "iterations": None if self.iterations is None else sorted(self.iterations),
            "every": self.every,
            "sample_size": self.sample_size,
            "sampling": "a uniform random subsample of at most sample_size values per record (its own "
            "generator); KS and D_n statistics are computed on it",
            "bins": self.bins,
            "ks": sorted(self.ks_paths),
            "dn": self.dn,
            "slices": self.slices,
            "clip_curve": self.clip_curve,
            "compare": list(self.compare),
        }

    def save(self, folder: str | Path, extra: dict[str, Any] | None = None) -> None:
        """records.json (the config, the records, `extra`) and samples.npz, each written atomically."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        body = {"config": self.config(), "records": self.records, **(extra or {})}
        # strict JSON: a NaN statistic (a constant tensor's KS fit) or a diverged loss becomes null
        strict = json.loads(json.dumps(body), parse_constant=lambda _: None)
        write_file(folder / "records.json", json.dumps(strict, allow_nan=False))
        with open(folder / ".samples.npz.tmp", "wb") as f:
            np.savez_compressed(f, **self.samples)
        (folder / ".samples.npz.tmp").replace(folder / "samples.npz")


def _scalars(state: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in state.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def load(folder: str | Path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(records.json's content, the samples by key) of a folder `StatsRecorder.save` wrote."""
    folder = Path(folder)
    body = json.loads((folder / "records.json").read_text())
    with np.load(folder / "samples.npz") as npz:
        samples = {k: npz[k] for k in npz.files}
    return body, samples
