"""The speed claims DAIQ and UI8 both make: an INT8 training iteration is faster than an FP32 one (DAIQ
Table 7, UI8 Table 10) and than an FP16 one (DAIQ Table 7), read from the speed tables timed on the
device at hand."""

from __future__ import annotations

from collections.abc import Callable

from repro.steptime import COMPILED_SUFFIX
from tables.claims.context import Context, row
from tables.claims.intervals import num
from tables.claims.verdict import INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED, Claim, Verdict
from tables.speed_spec import HALF, variant_name, with_half_float_layers

# (speed table, its INT8 method, the paper's table) each speed claim reads; UI8 Table 10 has no FP16 row
INT8_SPEED_ROWS = {
    "FP32": (("table7", "daiq", "DAIQ Table 7"), ("ui8-table10", "ui8", "UI8 Table 10")),
    "FP16": (("table7", "daiq", "DAIQ Table 7"),),
}
# the opt-in reading: DAIQ with the layers it does not quantize in 16 bits (tables.speed_spec's
# with_half_float_layers), against the same FP16 rows; the paper does not say which precision its INT8 run
# keeps those layers in, and the methods' default keeps them float32
HALF_FLOAT_LAYERS = "16-bit float layers"


def _half_method(frame, method: str) -> str:
    """The table's name of a spec row's `method` on the table's device, whose half autocast is the method of
    its eager FP16 row ("daiq+half" is "daiq+bf16" on the CPU, "daiq+fp16" on CUDA)."""
    if not method.endswith("+" + HALF):
        return method
    eager = frame[~frame["method"].str.endswith(COMPILED_SUFFIX)]
    name = variant_name(method, str(row(eager, precision="FP16")["method"]))
    if not (frame["method"] == name).any():
        raise KeyError(f"no {name} row: the table was kept before it timed the opt-in rows (make table7)")
    return name


def _int8_faster(baseline: str, float_layers: str = "") -> Callable[[Context], Verdict]:
    column = "iteration_vs_fp16" if baseline == "FP16" else "iteration_vs_fp32"
    rows = (
        INT8_SPEED_ROWS[baseline]
        if not float_layers
        else tuple((t, with_half_float_layers(m), s) for t, m, s in INT8_SPEED_ROWS[baseline])
    )

    def check(ctx: Context) -> Verdict:
        parts, ratios, devices, timed = [], [], {}, []
        for table, spec_method, source in rows:
            frame = ctx.table(table)
            method = _half_method(frame, spec_method)
            # eager, and compiled where the table timed it (`--compile`): each ratio is against the
            # baseline timed the same way, and the claim has to hold for both
            for name, how in ((method, ""), (method + COMPILED_SUFFIX, ", compiled")):
                if how and not (frame["method"] == name).any():
                    continue
                r = row(frame, method=name)
                ratio = float(r[column])
                ratios.append(ratio)
                timed.append(f"{source}{how or ', eager'} {ratio:.2f}x")
                paper = num(r[f"paper_{column}"])
                what = f"ResNet-50 iteration, INT8 ({spec_method.partition('+')[0].upper()}"
                what += f", {float_layers}) over {baseline}" if float_layers else f") over {baseline}"
                parts.append(
                    f"{source}{how}: {what}: {ratio:.2f}"
                    + (f" (paper {paper:.2f})" if paper is not None else "")
                    + f"; {r['iteration_ms']:.0f} ms at batch {r['batch']}, {r['size']} px"
                )
                devices.setdefault(str(r["device"]), None)
        measured = "; ".join(parts) + " on " + " and ".join(devices)
        spread = f"{min(ratios):.2f}-{max(ratios):.2f}" if len(ratios) > 1 else f"{ratios[0]:.2f}"
        int8 = f"INT8 with {float_layers}" if float_layers else "INT8"
        timings = f"{len(ratios)} timings, no interval"
        key = f"ResNet-50 iteration time, {int8} over {baseline}: {spread}x ({timings})"
        table7 = ctx.table("table7")
        half = row(table7[~table7["method"].str.endswith(COMPILED_SUFFIX)], precision="FP16")
        if baseline == "FP16" and str(half["method"]) == "bf16" and max(ratios) < 0.2:
            slow = half["iteration_vs_fp32"]
            reason = (
                f"bf16 is emulated on this CPU ({slow:.1f}x FP32's time): it says nothing of a GPU's FP16"
            )
            return Verdict(INCONCLUSIVE, measured, reason, key)
        if max(ratios) < 0.95:
            return Verdict(REPRODUCED, measured, key=key)
        if max(ratios) > 1.05:
            reason = f"INT8 is slower than {baseline} on this device"
            if min(ratios) < 0.95:  # faster one way, slower the other: say which
                slow = [t for t, r in zip(timed, ratios, strict=True) if r > 1.05]
                fast = [t for t, r in zip(timed, ratios, strict=True) if r < 0.95]
                reason = f"INT8 is slower than {baseline} in {', '.join(slow)}, faster in {', '.join(fast)}"
            return Verdict(NOT_REPRODUCED, measured, reason, key)
        return Verdict(INCONCLUSIVE, measured, "within 5%", key)

    return check


CLAIMS = (
    Claim("int8-vs-fp32", "DAIQ / UI8", "DAIQ Table 7; UI8 Table 10",
          "INT8 training is faster per iteration than FP32", _int8_faster("FP32"), ("table7", "ui8-table10")),
    Claim("int8-vs-fp16", "DAIQ", "Table 7",
          "INT8 training is faster per iteration than FP16", _int8_faster("FP16"), ("table7",)),
    Claim("int8-vs-fp16-half-float-layers", "DAIQ", "Table 7",
          "INT8 training with its float layers in 16 bits (opt-in) is faster per iteration than FP16",
          _int8_faster("FP16", HALF_FLOAT_LAYERS), ("table7",)),
)  # fmt: skip
