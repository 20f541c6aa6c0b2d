"""UI8 Table 2: overhead of the clip-value search, reduced by the Periodic Update (ResNet-50).

Seconds per iteration of UI8 training when every layer re-optimises its clip value every 1, 10, 100 or
1000 iterations. Here (tables.speed) two UI8 variants are timed side by side: one that searches in
every iteration (period 1) and one that never does (the clip value fixed after the first step). A
period P then costs t_plain + (t_search - t_plain) / P per iteration, the search paid once per period:
exact in expectation, and each period's cost represented at its true frequency without timing 1000s
of iterations.
"""

from tables.spec import Source
from tables.speed_spec import PeriodRow, PeriodSpec

SPEC = PeriodSpec(
    name="ui8-table2",
    paper="UI8",
    table="Table 2",
    title="Overhead reduced with Periodic Update (ResNet-50)",
    paper_setting="ResNet-50; the paper names no device or batch for this table (its speed section uses a "
    "GeForce GTX 1080 Ti at batch 64)",
    doc=__doc__,
    rows=tuple(
        PeriodRow(p, s, Source("UI8", "Table 2", f"Period {p}"))
        for p, s in ((1, 1.006), (10, 0.364), (100, 0.301), (1000, 0.297))
    ),
)
