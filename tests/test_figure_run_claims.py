"""Figure runs shared out between processes (`make figures JOBS=2`): a run another process holds the claim
on is not trained twice; one it gave up unfinished (a killed process) is trained; no claim is left."""

from __future__ import annotations

from tables.cells import Claim
from tables.figures import runs


def test_a_run_another_process_holds_is_waited_for_not_trained_again(tmp_path, monkeypatch):
    root = tmp_path / "figures" / "runs"
    folder = {n: runs.run_folder(root, runs.RUNS[n], "smoke", None) for n in runs.RUNS}
    finished, killed, free = "resnet18-fp32", "resnet34-fp32", "resnet50-fp32"
    others = {n: Claim(root / f"{folder[n].name}.lock") for n in (finished, killed)}
    assert all(claim.acquire() for claim in others.values())  # another open file: another holder
    trained = []

    def other_process_ends():  # it finishes one run; the other it gives up, as a killed process does
        folder[finished].mkdir(parents=True)
        (folder[finished] / "result.json").write_text("{}")
        for claim in others.values():
            claim.release()

    def fake_train(spec, profile, run_folder, data_root, log):
        trained.append(spec.name)
        run_folder.mkdir(parents=True)
        (run_folder / "result.json").write_text("{}")
        if spec.name == free:
            other_process_ends()  # while this process trained the free run

    monkeypatch.setattr(runs, "train", fake_train)
    monkeypatch.setattr(runs, "read", lambda root, spec, profile, data_root: spec.name)
    got = runs.ensure([finished, killed, free], "smoke", tmp_path, progress=False)
    assert got == {finished: finished, killed: killed, free: free}
    assert trained == [free, killed]  # the free run first, without waiting; the finished one not at all
    assert not list(root.glob("*.lock"))
