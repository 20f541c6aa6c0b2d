"""Training recipes as data: one MMEngine config per task and profile, in tasks/configs/<task>/.

A recipe config holds the recipe's entries (lr, batch_size, epochs, ...) at its top level and, where
one network or one paper dataset differs, the difference in

    datasets = dict(imagenet=dict(...))                     one paper dataset
    networks = dict(alexnet=dict(...))                      one network, on any dataset
    datasets = dict(imagenet=dict(networks=dict(...)))      one network on one dataset
    overrides = dict(...)                                   the whole profile, whatever the network

applied in that order, so the more specific entry wins and `overrides` wins over all. Profiles build
on each other with MMEngine's `_base_` (smoke is the embedded recipe cut down), which merges these
dicts key by key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mmengine.config import Config

CONFIG_ROOT = Path(__file__).resolve().parent / "configs"
LAYERS = ("datasets", "networks", "overrides")


def _load(task: str, profile: str) -> dict[str, Any]:
    return Config.fromfile(str(CONFIG_ROOT / task / f"{profile}.py")).to_dict()


def recipe_entries(task: str, profile: str, network: str, paper_dataset: str) -> dict[str, Any]:
    """The recipe of `network` on `paper_dataset` at `profile`, from tasks/configs/<task>/<profile>.py."""
    cfg = _load(task, profile)
    dataset = cfg.get("datasets", {}).get(paper_dataset, {})
    out = {k: v for k, v in cfg.items() if k not in LAYERS}
    out.update({k: v for k, v in dataset.items() if k != "networks"})
    out.update(cfg.get("networks", {}).get(network, {}))
    out.update(dataset.get("networks", {}).get(network, {}))
    out.update(cfg.get("overrides", {}))
    return out
