"""Seeds fixed before the run (issue 62): the plan the kept tables give, read by `--seeds plan`."""

import json

import pandas as pd
import pytest

from tables import seed_plan
from tables.claims.context import Context
from tables.claims.verdict import recording_needs, seeds_note
from tables.command import main as repro_main
from tables.generate import DEFAULT_SEEDS
from tables.specs import SPECS

KEPT = "results/reference/embedded"


def test_the_committed_plan_is_what_the_kept_tables_give():
    written = json.loads(seed_plan.PLAN.read_text())
    again = seed_plan.plan(Context("embedded", progress=False, kept=seed_plan.Path(KEPT)))
    for plan in (written, again):
        plan.pop("written_at")
        plan["pilot"].pop("read_at")
    assert written == again


def test_each_planned_table_waits_on_an_inconclusive_claim_and_never_loses_seeds():
    written = json.loads(seed_plan.PLAN.read_text())
    verdicts = pd.read_csv(f"{KEPT}/claims.csv").set_index("key")["verdict"]
    assert written["tables"], "the kept report has claims that wait on seeds"
    for name, entry in written["tables"].items():
        now = SPECS[name].seeds.get("embedded", DEFAULT_SEEDS["embedded"])
        assert entry["now"] == now and now <= entry["seeds"] <= written["most_seeds"]
        assert all(verdicts[claim] == "inconclusive" for claim in entry["claims"])
        assert seed_plan.planned_seeds(name, "embedded") == entry["seeds"]
    unplanned = next(n for n in SPECS if n not in written["tables"])
    assert seed_plan.planned_seeds(unplanned, "embedded") == SPECS[unplanned].seeds.get(
        "embedded", DEFAULT_SEEDS["embedded"]
    )


def test_seeds_notes_are_recorded_only_inside_the_block():
    seeds_note({"outside": 3})
    with recording_needs() as found:
        seeds_note({"a": 4, "b": None})
    assert found == {"a": 4, "b": None}


def test_seeds_plan_on_the_command_line(tmp_path, capsys):
    # a profile the plan was not made for, and a count that is neither a number nor 'plan': exit 2
    assert repro_main(["table", "table4", "--profile", "smoke", "--seeds", "plan", "--cached-only",
                       "--results-dir", str(tmp_path)]) == 2  # fmt: skip
    assert "for profile 'embedded', not 'smoke'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:
        repro_main(["table", "table4", "--seeds", "many"])
    assert stop.value.code == 2
    capsys.readouterr()
    planned = seed_plan.planned_seeds("ui8-table5", "embedded")
    assert repro_main(["table", "ui8-table5", "--seeds", "plan", "--cached-only", "--no-progress",
                       "--results-dir", str(tmp_path)]) == 0  # fmt: skip
    meta = json.loads((tmp_path / "ui8-table5.meta.json").read_text())
    assert f"--seeds {planned}" in meta["command"] and meta["cells"]["total"] > 0


def test_seeds_plan_reaches_a_speed_table_as_no_seeds(capsys):
    """`make tables SEEDS=plan` passes --seeds plan to the speed tables too: they time one cell."""
    assert repro_main(["table", "table7", "--seeds", "plan", "--cached-only"]) == 2
    assert "--cached-only applies to the training tables" in capsys.readouterr().err
