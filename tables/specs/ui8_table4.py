"""UI8 Table 4: hyperparameters alpha and beta of the learning-rate scaling (MobileNetV2, CIFAR-10).

The paper prints only the INT8 top-1; the measured FP32 baseline is shown beside the rows. At the embedded
profile the stand-in for CIFAR-10 is Fashion-MNIST (docs/data.md says why); its numbers are not CIFAR-10
numbers. The generated header names the data actually used.
"""

from tables.spec import Reported, Source, Spec, row_factory

READING = (
    "Read as learning-rate scaling without clipping (c = max|G|), d_c updated every iteration: UI8 "
    "section 4.1 evaluates the scaling 'without clipping to control variable', and says Table 5 (both "
    "techniques, period 1) beats Tables 3 and 4."
)

BETA_FLOOR = (
    "beta only acts when exp(-alpha d_c) falls below it, i.e. when the cosine distance d_c exceeds "
    "ln(1/beta)/alpha (0.16 at alpha=10, beta=0.2; 0.08 at alpha=20, beta=0.2); while every layer's d_c "
    "stays below that, rows that differ only in beta train identically."
)

R = row_factory("UI8", "Table 4", paper_dataset="cifar10")


def _opts(alpha: float, beta: float) -> dict:
    return {"alpha": alpha, "beta": beta, "clip": False, "lr_scaling": True, "period": 1}


SPEC = Spec(
    name="ui8-table4",
    paper="UI8",
    table="Table 4",
    title="Comparison of different hyperparameters for learning rate scaling (UI8, MobileNetV2 on CIFAR-10)",
    doc=__doc__,
    notes=(READING, BETA_FLOOR),
    rows=(
        R("mobilenet_v2", "ui8", "alpha=10, beta=0.1", int8=92.82, options=_opts(10.0, 0.1)),
        R("mobilenet_v2", "ui8", "alpha=10, beta=0.2", int8=93.28, options=_opts(10.0, 0.2)),
        R(
            "mobilenet_v2",
            "ui8",
            "alpha=20, beta=0.1",
            int8=93.38,
            options=_opts(20.0, 0.1),
            also_reported=(
                Reported(
                    Source("UI8", "Table 5", "Period 100"),
                    int8=93.38,
                    note="same number, with clipping and scaling both on",
                ),
            ),
        ),
        R("mobilenet_v2", "ui8", "alpha=20, beta=0.2", int8=93.27, options=_opts(20.0, 0.2)),
    ),
)
