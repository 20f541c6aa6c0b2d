"""WAGEUBN (Yang et al., Neural Networks 2020), one folder: the method and the helpers only it uses.

method.py       the registered methods `wageubn` and `wageubn-e2-16` (where each quantizer acts)
fixed_point.py  the paper's quantization functions Q, R, Sd, CQ, SQ, Flag QE2, QW
norm_layers.py  quantized BatchNorm and ReLU, swapped in by Method.module_swaps
optim.py        the quantized Momentum optimizer with a fixed-point learning rate
"""

from repro.methods.wageubn.method import PARTS, Wageubn, WageubnE2x16, WageubnQuantizer

__all__ = ["PARTS", "Wageubn", "WageubnE2x16", "WageubnQuantizer"]
