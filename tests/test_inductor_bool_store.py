"""kernels.inductor_bool_store: compiled boolean results are the eager ones, written by the int8 path."""

import pytest
import torch
from torch._inductor.utils import run_and_get_code

from kernels import inductor_bool_store


@pytest.mark.parametrize(
    "shape, layout",
    [((4, 37, 5), "contiguous"), ((3, 16, 5, 5), "channels_last"), ((6, 33), "transposed")],
)
def test_compiled_masks_equal_eager_and_take_the_int8_store(shape, layout):
    inductor_bool_store.apply()
    torch._dynamo.reset()
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    elif layout == "transposed":
        x = x.t()

    def masks(x):
        return x > 0, (x.relu() + 1.0) <= 1.5

    out, code = run_and_get_code(torch.compile(masks), x)
    for compiled, eager in zip(out, masks(x), strict=True):
        assert compiled.dtype == torch.bool and torch.equal(compiled, eager)
    if layout != "transposed":  # a 37- or 400-element row: vector body and tail both stored this way
        assert "convert<int8_t>" in code[0] and "reinterpret_cast<int8_t*>" in code[0]
