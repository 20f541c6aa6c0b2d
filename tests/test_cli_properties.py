"""Property test over the command line: any argument list gives exit 0 or 2 (1 only for a failed run), one
line of error at most, and never a traceback. Training itself is replaced by a stub (tasks.runner.train),
so every check the command makes before and around training runs, but nothing trains."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tables.command import main

NAMES = ["resnet18", "resnet20", "mobilenet_v2", "r3d_18", "faster_rcnn", "fp32", "daiq", "ui8", "gq",
         "wageubn", "smoke", "embedded", "paper", "imagenet", "cifar10", "ucf101", "coco", "classification",
         "video", "detection", "nosuch"]  # fmt: skip
VALUES = st.one_of(
    st.sampled_from(NAMES),
    st.integers(-3, 5).map(str),
    st.sampled_from(["nan", "inf", "-1", "1e9", "0.5", "abc", "", "[1,", "true", "None"]),
    st.text("abcdk=.,[]{}:-_01 ", max_size=12),
)
PAIRS = st.one_of(
    st.sampled_from(["k=1.5", "k=-1", "k=nan", "A=0.7", "clip=false", "alpha=abc", "period=0", "k", "=",
                     "k==1", "lam=[1,", "nosuch=1", "optim_wrapper.optimizer.lr=0.1",
                     "optim_wrapper.optimizer.lr=[1,", "train_cfg.max_epochs=1", "nosuchkey.x=1", "foo"]),
    st.text("abk=.[]01", max_size=10),
)  # fmt: skip
FLAGS = {
    "--task": VALUES, "--model": VALUES, "--method": VALUES, "--profile": VALUES, "--seed": VALUES,
    "--paper-dataset": VALUES, "--checkpoint-interval": VALUES,
    "--method-options": st.lists(PAIRS, min_size=0, max_size=3),
    "--cfg-options": st.lists(PAIRS, min_size=0, max_size=3),
}  # fmt: skip


@st.composite
def train_argv(draw) -> list[str]:
    argv = ["train"]
    for flag in draw(st.lists(st.sampled_from(sorted(FLAGS)), max_size=6)):
        value = draw(FLAGS[flag])
        argv += [flag, *value] if isinstance(value, list) else [flag, value]
    if draw(st.booleans()):
        argv += ["--json"]
    return argv


@pytest.fixture
def no_training(monkeypatch):
    import tasks.runner as runner

    recorder = SimpleNamespace(final_loss=0.5, metrics={"cls/top1": 50.0}, per_sample={},
                               ms_per_iter=lambda: 1.0, skipped_samples=lambda: [])  # fmt: skip
    fake = SimpleNamespace(iter=1, resumed_from=None)
    monkeypatch.setattr(runner, "train", lambda cfg: (fake, recorder, False))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(argv=train_argv())
@example(argv=["train", "--method", "resnet18", "--model", ""])  # raised a TypeError once
def test_any_train_command_line_is_exit_0_or_2_and_one_line(argv, no_training, capsys):
    try:
        code = main(argv)
    except SystemExit as stop:  # argparse's own refusals
        code = stop.code
    err = capsys.readouterr().err
    assert code in (0, 2), (argv, code, err[-1500:])
    assert "Traceback" not in err, (argv, err[-1500:])
    if code == 2:
        errors = [line for line in err.splitlines() if line.startswith("error:") or ": error:" in line]
        assert len(errors) == 1, (argv, err[-1500:])
