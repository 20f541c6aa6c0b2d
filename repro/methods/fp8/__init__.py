"""FP8 training (Wang et al., NeurIPS 2018), one folder: the method and the number formats it simulates.

method.py   the registered method `fp8` (what is rounded where, the FP16 stochastic weight update)
formats.py  the FP8 (1-5-2) and FP16 (1-6-9) grids and round_to, simulated in float32
"""

from repro.methods.fp8.formats import FP8, FP16, FloatFormat, round_to
from repro.methods.fp8.method import Fp8Quantizer, Fp8Training, Fp16StochasticUpdate

__all__ = ["FP8", "FP16", "FloatFormat", "Fp16StochasticUpdate", "Fp8Quantizer", "Fp8Training", "round_to"]
