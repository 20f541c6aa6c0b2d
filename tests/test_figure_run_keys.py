"""A recorded run's cache key follows its model's recipe version: a model whose recipe changed alone
(tasks.classification.MODEL_RECIPE_VERSIONS) is trained again, every other model's runs stay cached."""

from __future__ import annotations

from tables.figures.runs import RunSpec
from tasks import classification


def _key(model: str) -> str:
    return RunSpec("probe", model, "daiq", "imagenet").key("embedded", None)


def test_a_models_own_recipe_version_changes_only_its_runs_keys(monkeypatch):
    before = {m: _key(m) for m in ("resnet18", "resnet50")}
    bumped = {**classification.MODEL_RECIPE_VERSIONS, "resnet50": "bumped"}
    monkeypatch.setattr(classification, "MODEL_RECIPE_VERSIONS", bumped)
    assert _key("resnet50") != before["resnet50"]
    assert _key("resnet18") == before["resnet18"]
