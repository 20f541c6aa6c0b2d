"""Every claim the report checks, in the report's order: each paper's own claims, then the ones DAIQ and UI8
make together."""

from __future__ import annotations

from tables.claims import close_to_fp32, daiq, speed, ui8, wageubn
from tables.claims.verdict import Claim

# the report's order (the kept reports' since issue 19): tables first, then the recorder's figures
ORDER = (
    "ui8-clipping", "ui8-period", "daiq-ablation", "wageubn-e2", "wageubn-sensitivity", "int8-vs-fp32",
    "int8-vs-fp16", "int8-vs-fp16-half-float-layers", "close-to-fp32", "ui8-ks", "ui8-distributions",
    "ui8-lower-lr", "ui8-phi", "ui8-exponential", "daiq-gvq-error", "daiq-inverted-t",
    "wageubn-flag-nonzeros", "wageubn-plain-qe2",
)  # fmt: skip
_BY_KEY = {c.key: c for m in (ui8, daiq, wageubn, speed, close_to_fp32) for c in m.CLAIMS}
CLAIMS: tuple[Claim, ...] = tuple(_BY_KEY[key] for key in ORDER)
