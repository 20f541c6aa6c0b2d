"""kernels.bench.report says whether the timed process kept freed memory for reuse (repro.heap), which
decides whether big tensors fault their pages in on every call, and which commit was timed."""

from __future__ import annotations

import json

import pytest

from kernels.bench import report


def _bench_json(tmp_path, heap_reused, commit_info=None):
    benchmarks = []
    for op in report.OPS:
        for impl, ms in (("int8", 2.0), ("int8-op", 1.0), ("fp32", 8.0), ("bf16", 3.0)):
            info = {"layer": "64-56-64-1-1", "count": 1, "op": op, "impl": impl, "threads": 2, "load": 1.0}
            if heap_reused is not None:
                info["heap_reused"] = heap_reused
            benchmarks.append({"extra_info": info, "stats": {"min": ms / 1e3, "median": ms / 1e3}})
    path = tmp_path / "kernel_bench.json"
    data = {"benchmarks": benchmarks, "datetime": "now"}
    if commit_info is not None:
        data["commit_info"] = commit_info
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize(
    "heap_reused,says",
    [(True, "Freed memory was kept"), (False, "went back to the system"), (None, None)],
)
def test_the_report_says_how_freed_memory_was_handled(tmp_path, heap_reused, says):
    text = report.markdown(*report.load(_bench_json(tmp_path, heap_reused)))
    assert "| 64-56-64-1-1 |" in text
    if says is None:  # a run from before the field existed: nothing claimed
        assert "Freed memory" not in text
    else:
        assert says in text


@pytest.mark.parametrize(
    "commit_info,says",
    [
        ({"id": "a7f6c9afe6309cd26d7dab181c5c801c2aaa033b", "dirty": False}, "at commit a7f6c9a on"),
        (
            {"id": "a7f6c9afe6309cd26d7dab181c5c801c2aaa033b", "dirty": True},
            "a7f6c9a with uncommitted changes",
        ),
        (None, "at commit ? on"),
    ],
)
def test_the_report_names_the_timed_commit(tmp_path, commit_info, says):
    text = report.markdown(*report.load(_bench_json(tmp_path, True, commit_info)))
    assert says in text
