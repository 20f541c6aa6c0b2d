"""The classification task: models, recipes, smoke runs on MMEngine's Runner, divergence, the CLI."""

import json

import pytest
import torch
import torchvision
from mmengine.config import Config
from mmengine.runner import Runner
from torch import nn

import repro
from repro.layers import quantizable_layers
from tables.command import main as main_command
from tasks import get_task, list_tasks
from tasks import models as M
from tasks.classification import RECIPE_VERSION, build_config, input_size, recipe, run
from tasks.runner import RunResult, check_loss
from tasks.top1 import unpack_flags


@pytest.fixture(autouse=True)
def data_cache(tmp_path_factory, monkeypatch):
    """The session's data cache (the same path as test_datasets uses), never ~/.cache."""
    monkeypatch.setenv("REPRO_DATA_CACHE", str(tmp_path_factory.getbasetemp() / "repro-data-cache"))


# ---------------------------------------------------------------------------------------------- models
@pytest.mark.parametrize("name", M.list_models())
def test_each_model_builds_for_its_classes_and_input_size(name):
    torch.manual_seed(0)
    size = M.MODELS[name].min_input
    model = M.build_model(name, num_classes=7, input_size=size).eval()
    with torch.no_grad():
        logits = model(torch.randn(2, 3, size, size))
    assert logits.shape == (2, 7) and torch.isfinite(logits).all()
    with pytest.raises(ValueError, match=f"at least {size} px"):
        M.build_model(name, 7, size - 1)


def test_model_names_and_unknown_model():
    assert M.list_models() == [
        "alexnet",
        "vgg16",
        "vgg16_bn",
        "resnet18",
        "resnet34",
        "resnet50",
        "mobilenet_v2",
        "inception_v3",
        "resnet20",
    ]
    with pytest.raises(ValueError, match="unknown model 'resnet99'; choose from alexnet, vgg16"):
        M.build_model("resnet99", 10, 32)


def test_resnet20_has_the_cifar_structure():
    model = M.build_model("resnet20", num_classes=10, input_size=32)
    stages = [model.layer1, model.layer2, model.layer3]
    assert [len(s) for s in stages] == [3, 3, 3]
    assert all(isinstance(b, M.BasicBlockA) for s in stages for b in s)
    assert [s[0].conv2.out_channels for s in stages] == [16, 32, 64]
    assert model.conv1.out_channels == 16 and model.fc.in_features == 64
    assert [s[0].conv1.stride for s in stages] == [(1, 1), (2, 2), (2, 2)]
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    assert len(convs) + 1 == 20  # 19 convolutions and the classifier: ResNet-20
    assert not any(isinstance(m, nn.Conv2d) for s in stages for b in s for m in b.shortcut.modules())
    params = sum(p.numel() for p in model.parameters())
    assert 0.26e6 < params < 0.28e6  # He et al. 2016, Table 6: 0.27M
    x = torch.randn(2, 3, 32, 32)
    assert model.layer3(model.layer2(model.layer1(model.conv1(x)))).shape == (2, 64, 8, 8)


def test_alexnet_and_vgg16_are_torchvisions_at_224_and_pool_1x1_when_the_map_is_1x1():
    big = M.build_model("alexnet", 1000, 224)
    ref = torchvision.models.alexnet()
    assert [tuple(p.shape) for p in big.parameters()] == [tuple(p.shape) for p in ref.parameters()]
    small = M.build_model("vgg16", 10, 32)
    ref = torchvision.models.vgg16(num_classes=10)
    assert [type(m) for m in small.features] == [type(m) for m in ref.features]
    assert small.classifier[0].in_features == 512 and small.classifier[3].in_features == 4096
    assert not any(isinstance(m, nn.BatchNorm2d) for m in small.modules())  # the plain VGG-16


def test_he_init_reinitialises_convolutions_and_linears():
    torch.manual_seed(0)
    own = M.build_model("inception_v3", 10, 75)
    torch.manual_seed(0)
    he = M.build_model("inception_v3", 10, 75, init="he")
    assert [n for n, _ in own.named_parameters()] == [n for n, _ in he.named_parameters()]
    assert abs(he.fc.weight.std().item() - 0.01) < 0.002 and own.fc.weight.std().item() > 0.05
    with pytest.raises(ValueError, match="unknown init 'xavier'"):
        M.build_model("resnet18", 10, 32, init="xavier")


def test_zero_residual_init_is_torchvisions_zero_init_residual():
    for name, bn in (("resnet50", "bn3"), ("resnet18", "bn2")):
        torch.manual_seed(0)
        ours = M.build_model(name, 10, 32, init="zero-residual")
        torch.manual_seed(0)
        ref = getattr(torchvision.models, name)(weights=None, num_classes=10, zero_init_residual=True)
        assert all(
            torch.equal(a, b)
            for a, b in zip(ours.state_dict().values(), ref.state_dict().values(), strict=True)
        )
        assert getattr(ours.layer1[0], bn).weight.abs().sum() == 0 and ours.bn1.weight.abs().sum() > 0
    with pytest.raises(ValueError, match="needs a torchvision ResNet"):
        M.build_model("alexnet", 10, 64, init="zero-residual")


def test_the_embedded_resnet50_starts_its_blocks_as_the_identity():
    assert recipe("resnet50", "embedded", "imagenet")["init"] == "zero-residual"
    assert recipe("resnet50", "paper", "imagenet")["init"] is None  # the paper profile: its own init
    assert recipe("resnet18", "embedded", "imagenet")["init"] is None


# --------------------------------------------------------------------------------------------- recipes
def test_recipes_follow_the_papers_schedulers():
    assert recipe("mobilenet_v2", "embedded", "imagenet")["scheduler"] == "cosine"
    for model in ("resnet18", "alexnet", "vgg16", "inception_v3"):
        assert recipe(model, "embedded", "imagenet")["scheduler"] == "multistep"
    paper = recipe("resnet20", "paper", "cifar10")
    assert paper["epochs"] == 164 and paper["milestones"] == (82, 123)
    assert (paper["batch_size"], paper["lr"], paper["weight_decay"]) == (128, 0.1, 1e-4)
    assert recipe("resnet50", "paper", "imagenet")["milestones"] == (30, 60)
    assert recipe("resnet50", "embedded", "imagenet")["lr"] == 0.1 * 32 / 256  # linear scaling
    assert input_size("inception_v3", "embedded", "imagenet") >= 75
    assert input_size("alexnet", "smoke", "imagenet") >= 63
    assert input_size("resnet50", "paper", "imagenet") == 224
    assert RECIPE_VERSION


def test_small_scale_substitutions_are_in_the_config_and_not_at_paper_scale(tmp_path):
    small = build_config("vgg16", "fp32", profile="embedded")["model"]
    assert (small["arch"], small["init"]) == ("vgg16_bn", None)
    assert build_config("alexnet", "fp32", profile="smoke")["model"]["init"] == "he"
    (tmp_path / "train" / "n01").mkdir(parents=True)
    paper = build_config("vgg16", "fp32", profile="paper", data_root=str(tmp_path))
    assert (paper["model"]["arch"], paper["model"]["init"], paper["model"]["num_classes"]) == (
        "vgg16",
        None,
        1,
    )
    assert paper["model"]["input_size"] == 224 and paper["train_dataloader"]["batch_size"] == 256


def test_multistep_milestones_in_fractional_epochs_become_whole_iterations():
    from tasks.top1 import EpochMultiStepLR

    opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = EpochMultiStepLR.build_iter_from_epoch(opt, milestones=[1.0, 1.5], epoch_length=44, gamma=0.1)
    assert sorted(sched.milestones) == [44, 66] and not sched.by_epoch


@pytest.mark.parametrize(
    "kwargs, what",
    [
        (dict(model="resnet99", method="daiq"), "model"),
        (dict(model="resnet18", method="int4"), "method"),
        (dict(model="resnet18", method="daiq", profile="huge"), "profile"),
        (dict(model="resnet18", method="daiq", paper_dataset="mnist"), "paper_dataset"),
    ],
)
def test_unknown_names_are_value_errors_listing_the_choices(kwargs, what):
    with pytest.raises(ValueError, match=f"unknown {what} .*; choose from ") as err:
        run(**kwargs)
    assert "\n" not in str(err.value)


def test_task_registry():
    assert list_tasks() == ["classification", "video", "detection"]
    assert get_task("classification").run is run
    with pytest.raises(ValueError, match="unknown task 'segmentation'; choose from classification, video"):
        get_task("segmentation")


def test_paper_profile_without_data_is_one_clear_line(tmp_path):
    from tasks.datasets import DatasetNotFoundError

    with pytest.raises(DatasetNotFoundError) as err:
        run("resnet20", "fp32", profile="paper", paper_dataset="cifar10", data_root=str(tmp_path))
    assert "\n" not in str(err.value) and "cifar-10-batches-py/data_batch_1..5" in str(err.value)
    with pytest.raises(DatasetNotFoundError, match="train/<class>"):
        run("resnet18", "fp32", profile="paper", paper_dataset="imagenet", data_root=str(tmp_path))


def test_check_loss_stops_on_nan_and_inf():
    check_loss(torch.tensor(1.5))
    for bad in (float("nan"), float("inf")):
        with pytest.raises(repro.NonFiniteError, match="non-finite training loss"):
            check_loss(torch.tensor(bad))


# ------------------------------------------------------------------------------------------ smoke runs
def _sane(result: RunResult, model: str, method: str, dataset: str):
    assert isinstance(result, RunResult)
    d = result.to_dict()
    assert d["task"] == "classification" and (d["model"], d["method"]) == (model, method)
    assert d["profile"] == "smoke" and d["dataset"] == dataset and d["simulated"] is False
    assert d["diverged"] is False and d["iters"] > 0 and d["epochs"] >= 1
    assert 0.0 <= d["top1"] <= 100.0
    assert d["final_loss"] is not None and torch.isfinite(torch.tensor(d["final_loss"]))
    assert d["ms_per_iter"] > 0


def test_smoke_run_daiq_returns_a_sane_result():
    result = run("resnet18", "daiq", profile="smoke", seed=1, method_options={"k": 1.2})
    _sane(result, "resnet18", "daiq", "digits")
    assert result.paper_dataset == "imagenet" and result.method_options == {"k": 1.2} and result.seed == 1
    assert result.iters == 6  # 30 images, batch 8, drop_last, 2 epochs
    flags = unpack_flags(result.val_correct)  # which validation images were right, for paired errors
    assert len(flags) == 40 and 100.0 * sum(flags) / 40 == pytest.approx(result.top1)


def test_embedded_trains_on_real_data_and_smoke_on_the_local_sets():
    assert recipe("resnet18", "embedded", "imagenet")["stand_in"] == "fashion-mnist"
    assert recipe("resnet18", "embedded", "imagenet")["val_limit"] is None  # the whole 10,000-image test set
    assert recipe("resnet18", "smoke", "imagenet")["stand_in"] == "digits"
    assert recipe("resnet20", "smoke", "cifar10")["stand_in"] == "shapes10"
    assert build_config("resnet18", "fp32", profile="embedded")["val_dataloader"]["dataset"]["dataset"] == (
        "fashion-mnist"
    )


def test_int8_hook_swaps_the_layers_in_the_run(tmp_path):
    cfg = build_config("resnet20", "daiq", profile="smoke", paper_dataset="cifar10", work_dir=str(tmp_path))
    cfg["train_cfg"]["max_epochs"] = 1
    runner = Runner.from_cfg(Config(cfg))
    runner.train()
    layers = quantizable_layers(runner.model)
    swapped = repro.quantized_layers(runner.model)
    assert len(swapped) == len(layers) - 2  # first conv and classifier stay float
    assert layers[0][0] == "net.conv1" and "net.conv1" not in swapped and "net.fc" not in swapped
    assert {m.int8.method.name for m in swapped.values()} == {"daiq"}


@pytest.mark.parametrize("method", ["fp32", "daiq"])
def test_an_absurd_learning_rate_is_recorded_as_diverged(method):
    result = run(
        "resnet20",
        method,
        profile="smoke",
        paper_dataset="cifar10",
        cfg_options={"optim_wrapper.optimizer.lr": 1e30},
    )
    assert result.diverged is True
    assert result.top1 is None and result.final_loss is None
    assert result.iters < 6 and result.dataset == "shapes10"


# ------------------------------------------------------------------------------------------------- CLI
def test_cli_train_fp32_with_cfg_options(capsys):
    from tables.command import main

    argv = ["train", "--task", "classification", "--model", "mobilenet_v2", "--method", "fp32"]
    argv += ["--profile", "smoke", "--paper-dataset", "cifar10", "--seed", "2", "--json"]
    argv += ["--cfg-options", "train_cfg.max_epochs=1", "log_level=ERROR"]
    assert main(argv) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["epochs"] == 1 and result["iters"] == 3 and result["seed"] == 2
    assert result["dataset"] == "shapes10" and result["method"] == "fp32"
    assert 0 <= result["top1"] <= 100 and result["ms_per_iter"] > 0 and result["final_loss"] > 0


@pytest.mark.parametrize(
    "flag, value, what",
    [("--model", "resnet99", "model"), ("--method", "int4", "method"), ("--profile", "huge", "profile")],
)
def test_cli_bad_names_exit_2_with_one_line(capsys, flag, value, what):
    from tables.command import main

    argv = {"--model": "resnet18", "--method": "daiq", "--profile": "smoke"}
    argv[flag] = value
    assert main(["train", *[x for kv in argv.items() for x in kv]]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert err.startswith(f"error: unknown {what} {value!r}; choose from ")


def test_module_entry_point_bad_name_exits_2(capsys):
    from tasks.classification import main

    assert main(["--model", "resnet18", "--method", "int4", "--profile", "smoke"]) == 2
    assert "unknown method 'int4'; choose from" in capsys.readouterr().err


@pytest.mark.parametrize(
    "options, message",
    [
        (["k=abc"], "error: option k of method daiq takes a number, got 'abc'"),
        (["lam=2"], "error: lam is a probability threshold in [0, 1], got 2.0"),
        (["alpha=1"], "error: method 'daiq' has no option alpha; its options: A, k, lam"),
    ],
)
def test_cli_bad_method_options_exit_2_with_one_line(capsys, options, message):
    argv = ["train", "--model", "resnet18", "--method", "daiq", "--profile", "smoke", "--method-options"]
    assert main_command([*argv, *options]) == 2
    err = capsys.readouterr().err.strip()
    assert err == message


@pytest.mark.parametrize(
    "flag, pairs, message",
    [
        ("--method-options", ["k"], "--method-options: 'k' is not key=value"),
        ("--method-options", ["=1"], "--method-options: '=1' is not key=value"),
        ("--cfg-options", ["foo"], "--cfg-options: 'foo' is not key=value"),
        ("--cfg-options", ["optim_wrapper.optimizer.lr=[1,"], "--cfg-options: cannot parse"),
        ("--method-options", ["k=-1"], "error: k scales the Inverted-T step and must be positive, got -1.0"),
    ],
)
def test_cli_malformed_key_value_pairs_exit_2_with_one_line(capsys, flag, pairs, message):
    """A malformed pair was a traceback (ValueError, AssertionError) and exit 1."""
    argv = ["train", "--model", "resnet18", "--method", "daiq", "--profile", "smoke", flag, *pairs]
    try:
        code = main_command(argv)
    except SystemExit as stop:  # argparse's own way out
        code = stop.code
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err


@pytest.mark.parametrize("interval, saved", [(None, False), ("0", True)])
def test_cli_checkpoint_interval_lets_a_smoke_run_save_checkpoints(tmp_path, capsys, interval, saved):
    """A smoke run saves no checkpoint by default (60 s apart at least); --checkpoint-interval 0 saves them,
    so that resuming can be tried in a minute."""
    argv = ["train", "--model", "mobilenet_v2", "--method", "fp32", "--profile", "smoke"]
    argv += ["--paper-dataset", "cifar10", "--work-dir", str(tmp_path / "run")]
    argv += ["--cfg-options", "train_cfg.max_epochs=1", "log_level=ERROR"]
    argv += [] if interval is None else ["--checkpoint-interval", interval]
    assert main_command(argv) == 0
    assert bool(list((tmp_path / "run").rglob("*.pth"))) is saved


def test_cli_negative_checkpoint_interval_is_one_line(capsys):
    argv = ["train", "--model", "resnet18", "--method", "fp32", "--profile", "smoke", "--checkpoint-interval"]
    assert main_command([*argv, "-1"]) == 2
    assert capsys.readouterr().err.strip() == "error: --checkpoint-interval takes seconds >= 0, got -1.0"


def test_cli_unknown_config_keys_are_warned_with_a_suggestion(capsys):
    """MMEngine adds a key the config lacks (right for a new hook, a silent no-op for a typo): warned,
    with the nearest existing key."""
    argv = ["train", "--model", "mobilenet_v2", "--method", "fp32", "--profile", "smoke"]
    argv += ["--paper-dataset", "cifar10", "--cfg-options", "train_cfg.max_epochs=1", "log_level=ERROR"]
    with pytest.warns(UserWarning) as record:
        assert main_command([*argv, "optim_wraper.optimizer.lr=0.1"]) == 0
    texts = [str(w.message) for w in record if "--cfg-options" in str(w.message)]
    assert len(texts) == 1 and "no key 'optim_wraper' (did you mean 'optim_wrapper'?)" in texts[0], texts


def test_new_nested_config_keys_are_named_with_the_nearest_one():
    from mmengine.config import Config

    from tasks.runner import warn_new_keys

    cfg = Config(dict(train_cfg=dict(max_epochs=3), default_hooks=dict(logger=dict(interval=1))))
    options = {"train_cfg.max_epochs": 1, "train_cfg.max_epoch": 2, "default_hooks.logger.intervall": 5}
    options |= {"default_hooks.int8.type": "Int8TrainingHook", "custom_hooks": [], "launcher": "none"}
    with pytest.warns(UserWarning):
        found = warn_new_keys(cfg, options)
    assert len(found) == 2, found  # a new hook and the Runner's own keys are expected, not warned
    assert "train_cfg has no key 'max_epoch' (did you mean 'train_cfg.max_epochs'?)" in found[0]
    assert "logger has no key 'intervall' (did you mean 'default_hooks.logger.interval'?)" in found[1]
