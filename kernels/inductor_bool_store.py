"""Faster stores and loads of boolean vectors in inductor's CPU code, for compiled training steps.

torch 2.13's inductor writes a vectorised boolean result (a ReLU's saved mask, a comparison) through
``VecMask<float, N>::store(bool*)``, which goes through the generic 64-lane ``Vectorized<bool>`` one element
at a time: a compiled ``x > 0`` on 3.2M floats took 14 ms against 0.6 eager, and a compiled BatchNorm + ReLU
training forward 16 ms against 0.6 (docs/measurements.md). It reads one back (the backward pass's
threshold_backward) through ``VecMask<float, N>::from(bool*, count)``, a scalar loop of a compare and a
branch per element. A quantized model saves such a mask for every ReLU, because its next layer keeps int8
codes instead of the float output, and reads it in the backward pass.

Here the same bytes (0 or 1) are written as the mask converted to float and then to int8, the path inductor's
own ``x.to(torch.int8)`` takes, and read as int8 codes converted to float and compared with zero, the path of
its own int8 loads. Only contiguous stores and loads of a mask of one or two float vectors change: one where
a kernel's tile is 16 floats wide (float32), two where it is 32 (a bfloat16 tensor's, as under bf16
autocast; first left out: a compiled ResNet-50 `gq+bf16` step then spent half of its BatchNorm kernels'
time in these loops, docs/measurements.md). Everything else keeps inductor's code. A no-op post-grad pass
named after this file puts the patch in the key of inductor's graph cache, so graphs compiled before it (or
without it) are not taken from the cache.
"""

from __future__ import annotations

import torch

_applied = False


def apply() -> None:
    """Patch inductor's CPU vector kernel once per process (torch.compile's FP32 graphs get it too)."""
    global _applied
    if _applied:
        return
    from torch._inductor.codegen import cpp
    from torch._inductor.codegen.cpp_utils import cexpr_index
    from torch._inductor.utils import IndentedBuffer

    inductor_store = cpp.CppVecKernel._get_store_line

    def _get_store_line(self, value, var, index, dtype, accu_store=False):
        if dtype == torch.bool and not accu_store and not isinstance(value, str):
            contiguous = self._try_get_const_stride(index, self.itervars[self.tiling_idx]) == 1
            vectors = self._get_num_vectors(torch.float)
            if contiguous and vectors in (1, 2):
                code = IndentedBuffer()
                target = f"reinterpret_cast<int8_t*>({var} + {cexpr_index(index)})"
                convert = "at::vec::convert<int8_t>" if vectors == 1 else "at::vec::convert<int8_t,1,float,2>"
                code.writeline(
                    f"{convert}({value}.template to<float,{vectors}>())"
                    f".store({target}, {cexpr_index(self.num_elems)});"
                )
                return code
        return inductor_store(self, value, var, index, dtype, accu_store)

    cpp.CppVecKernel._get_store_line = _get_store_line

    inductor_load = cpp.CppVecKernel._get_vec_load_line

    def _get_vec_load_line(self, var, index, dtype, load_mask=None):
        vectors = self._get_num_vectors(torch.float)
        if dtype == torch.bool and vectors in (1, 2):
            loadbuf = f"{var} + {cexpr_index(index)}" if index != 0 else var
            codes = f"at::vec::Vectorized<int8_t>::loadu(reinterpret_cast<const int8_t*>({loadbuf}), "
            codes += f"{cexpr_index(self.num_elems)})"
            convert = "at::vec::convert<float>" if vectors == 1 else "at::vec::convert<float,2,int8_t,1>"
            floats = f"at::vec::VectorizedN<float,{vectors}>"
            return f"{self._get_mask_type()}({floats}({convert}({codes})) != {floats}(0.0f))"
        return inductor_load(self, var, index, dtype, load_mask)

    cpp.CppVecKernel._get_vec_load_line = _get_vec_load_line
    if torch._inductor.config.post_grad_custom_post_pass is None:
        torch._inductor.config.post_grad_custom_post_pass = _CacheKey()
    else:  # someone's own pass is there: no cache rather than a cached graph without the patch
        torch._inductor.config.fx_graph_cache = False
    _applied = True


def _cache_key_pass():
    from torch._inductor.custom_graph_pass import CustomGraphPass, get_hash_for_files

    class CacheKey(CustomGraphPass):
        def __call__(self, graph) -> None:
            pass

        def uuid(self):
            return get_hash_for_files((__file__,))

    return CacheKey


def _CacheKey():  # noqa: N802 - the class is made on first use: importing inductor costs a second
    return _cache_key_pass()()
