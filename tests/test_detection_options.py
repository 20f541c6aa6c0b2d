"""An MMDetection config's own Int8TrainingHook options are kept, merged with the command line's (the
command line wins), recorded with where each came from, and an option the method cannot take stops the
run with one line (issue 61: `set_method` rebuilt the hook and kept only `skip`)."""

import dataclasses

import pytest
from mmengine.config import Config

from tables.command import main as repro_main
from tasks import detection as D
from tasks.runner import RunResult

BASE = D.config_path("faster_rcnn_r50_fpn", "embedded", "coco")


def user_config(tmp_path, hook: str, where: str = "custom_hooks") -> str:
    path = tmp_path / "user.py"
    if where == "custom_hooks":
        body = f"custom_hooks = [{hook}]\n"
    else:  # the --cfg-options spelling: a named entry of default_hooks
        body = f"custom_hooks = []\ndefault_hooks = dict(int8={hook})\n"
    path.write_text(f"_base_ = {str(BASE)!r}\n{body}")
    return str(path)


@pytest.mark.parametrize("where", ["custom_hooks", "default_hooks"])
def test_config_options_are_kept_and_the_command_line_wins(tmp_path, where):
    path = user_config(
        tmp_path, 'dict(type="Int8TrainingHook", method="daiq", k=1.5, A=0.7, skip=("first",))', where
    )
    cfg = Config.fromfile(path)
    options, sources = D.merged_method_options(cfg, "daiq", {"A": 0.9})
    assert options == {"k": 1.5, "A": 0.9}
    assert sources == {"k": "config", "A": "command line"}
    D.set_method(cfg, "daiq", options)
    hooks = [h for h in cfg.custom_hooks if str(h["type"]).endswith("Int8TrainingHook")]
    assert hooks == [dict(type="Int8TrainingHook", method="daiq", skip=("first",), k=1.5, A=0.9)]
    assert not [h for h in cfg.default_hooks.values() if str(h.get("type", "")).endswith("Int8TrainingHook")]


def test_the_run_record_says_which_options_it_used_and_whence(tmp_path, monkeypatch):
    path = user_config(tmp_path, 'dict(type="Int8TrainingHook", method="daiq", k=1.5)')
    seen = {}

    def fake_run_config(build, spec, **kw):
        seen["cfg"] = build(str(tmp_path / "work"))
        fields = dict(task="detection", dataset="x", epochs=None, iters=1, final_loss=0.1, diverged=False)
        return RunResult(
            model=spec.model, method=spec.method, profile=spec.profile, paper_dataset=spec.paper_dataset,
            seed=spec.seed, ms_per_iter=1.0, method_options=spec.method_options, **fields,
        )  # fmt: skip

    monkeypatch.setattr(D, "run_config", fake_run_config)
    monkeypatch.setattr(D, "check_annotation_files", lambda cfg: None)
    monkeypatch.setattr(D.DD, "ensure_shapes_det", lambda root: tmp_path)
    result = D.run("user", "daiq", profile="smoke", config=path, method_options={"lam": 0.5})
    record = result.to_dict()
    assert record["method_options"] == {"k": 1.5, "lam": 0.5}
    assert record["method_options_from"] == {"k": "config", "lam": "command line"}
    hook = next(h for h in seen["cfg"].custom_hooks if h["type"] == "Int8TrainingHook")
    assert (hook["k"], hook["lam"]) == (1.5, 0.5)
    assert dataclasses.replace(result).method_options_from == record["method_options_from"]


@pytest.mark.parametrize(
    "hook,says",
    [
        ('dict(type="Int8TrainingHook", method="daiq", clip=3)', "clip"),
        ('dict(type="Int8TrainingHook", method="ui8", k=1.5)', "for method 'ui8'"),
        ('dict(type="Int8TrainingHook", method="daiq", k="wide")', "k"),
    ],
    ids=["unknown-option", "another-method", "bad-value"],
)
def test_an_option_the_run_cannot_honour_is_one_line_and_exit_2(tmp_path, capsys, hook, says):
    path = user_config(tmp_path, hook)
    argv = ["train", "--task", "detection", "--config", path, "--method", "daiq", "--profile", "smoke"]
    assert repro_main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0] and "Int8TrainingHook" in err[0], err


def test_two_int8_hooks_in_one_config_are_refused(tmp_path):
    path = tmp_path / "two.py"
    path.write_text(
        f"_base_ = {str(BASE)!r}\ndefault_hooks = dict(int8=dict(type='Int8TrainingHook', method='ui8'))\n"
    )
    with pytest.raises(ValueError, match="2 Int8TrainingHook entries"):
        D.config_hook(Config.fromfile(str(path)))
