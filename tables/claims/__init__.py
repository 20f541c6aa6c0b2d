"""What was reproduced: the papers' qualitative claims, each checked by a measurement made here.

    make claims [PROFILE=embedded]        # results/claims.md and results/claims.csv
    python -m tables.claims --profile smoke --results-dir results

Every claim names its source (paper, table or figure) and checks it with numbers this harness measures:
the tables it regenerates (cached cells, so a report after `make tables` costs nothing more), the speed
tables on the device at hand, the statistics recorder's figures. The verdict is computed from those
numbers, never typed: `reproduced`, `not reproduced`, or `inconclusive` with the reason (one seed and no
estimate of the noise, a difference within the seeds' spread, a stand-in that cannot show it). At the
smoke profile most verdicts are inconclusive, and say so; the embedded report is kept as
results/reference/embedded/claims.md, and README.md's summary is generated from it (tables/readme.py).
None of it is a paper-scale (ImageNet, COCO) result.

One module per paper's claims (ui8, daiq, wageubn) and per claim the papers make together (speed,
close_to_fp32); verdict holds the verdict rules, intervals the statistics, context what a claim reads,
registry the report's order, render the Markdown and report the files and the command line.
"""

from tables.claims.close_to_fp32 import CLOSE_TO_FP32_TABLES
from tables.claims.context import Context, NotKept
from tables.claims.intervals import Comparison, Estimate, compare, compare_rows, mean_over_models
from tables.claims.registry import CLAIMS
from tables.claims.report import CSV_COLUMNS, evaluate, main, write
from tables.claims.verdict import INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED, Claim, Verdict

__all__ = [
    "CLAIMS", "CLOSE_TO_FP32_TABLES", "CSV_COLUMNS", "INCONCLUSIVE", "NOT_REPRODUCED", "REPRODUCED", "Claim",
    "Comparison", "Context", "Estimate", "NotKept", "Verdict", "compare", "compare_rows", "evaluate", "main",
    "mean_over_models", "write",
]  # fmt: skip
