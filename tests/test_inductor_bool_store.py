"""kernels.inductor_bool_store: compiled boolean results are the eager ones, written by the int8 path."""

import pytest
import torch
from torch._inductor.utils import run_and_get_code

from kernels import inductor_bool_store


@pytest.mark.parametrize(
    "shape, layout",
    [((4, 37, 5), "contiguous"), ((3, 16, 5, 5), "channels_last"), ((6, 33), "transposed")],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])  # tiles of 16 and of 32 lanes
def test_compiled_masks_equal_eager_and_take_the_int8_store(shape, layout, dtype):
    inductor_bool_store.apply()
    torch._dynamo.reset()
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(0)).to(dtype)
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    elif layout == "transposed":
        x = x.t()

    def masks(x):
        return x > 0, (x.relu() * 2.0) <= 3.0  # exact in bfloat16 too (inductor computes it in float32)

    out, code = run_and_get_code(torch.compile(masks), x)
    for compiled, eager in zip(out, masks(x), strict=True):
        assert compiled.dtype == torch.bool and torch.equal(compiled, eager)
    if layout != "transposed":  # a 37- or 400-element row: vector body and tail both stored this way
        stores = [line for line in code[0].splitlines() if ".store(" in line]  # both outputs are masks
        assert stores and all("convert<int8_t" in s and "reinterpret_cast<int8_t*>" in s for s in stores)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_mask_reads_equal_eager_and_take_the_int8_load(dtype):
    """A mask read back (a ReLU's backward pass reads the one its forward pass saved), body and tail."""
    inductor_bool_store.apply()
    torch._dynamo.reset()
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(3, 40, 5, 5, generator=gen).to(dtype).contiguous(memory_format=torch.channels_last)
    mask = (torch.rand(3, 40, 5, 5, generator=gen) > 0.5).contiguous(memory_format=torch.channels_last)

    def masked(x, m):
        return torch.where(m, x * 2.0, x * 0.0)

    out, code = run_and_get_code(torch.compile(masked), x, mask)
    assert torch.equal(out, masked(x, mask))
    assert "reinterpret_cast<const int8_t*>" in code[0] and "::from(" not in code[0]
