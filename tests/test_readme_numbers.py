"""README.md's numbers come from kept files: its "What was reproduced" table is generated from the kept
claims report (tables/readme.py), and no measured number stands in its prose by hand, where it drifts."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tables import readme

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
REPORT = ROOT / readme.REPORT

# what a measurement looks like in prose: a decimal, a ratio, a duration or size, a percentage, a +- spread,
# a count of what the tables are made of
MEASURED = re.compile(
    r"\b\d+(?:\.\d+)?x\b|\b\d+m\d+s\b|\b\d+(?:\.\d+)?\s?(?:ms|s|min|minutes|h|hours|GiB|GB|MB|TOPS)\b"
    r"|\b\d+(?:\.\d+)?\s?%|\d+\.\d+|±"
    r"|\b\d[\d,]*\s(?:claims|rows|seeds|runs|intervals|points?|iterations|models|cells|digits|images)\b"
)


def prose(text: str) -> str:
    """The README without its generated blocks, code blocks, inline code and link targets."""
    text = re.sub(r"<!-- claims:begin.*?<!-- claims:end -->", "", text, flags=re.S)
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = "\n".join(line for line in text.splitlines() if not line.startswith("    "))
    text = re.sub(r"`[^`]*`", "", text)
    text = text.replace("95% interval", "interval")  # the interval's level, a choice, not a measurement
    return re.sub(r"\]\([^)]*\)", "]", text)


def test_the_readme_claims_block_is_the_kept_reports():
    assert readme.generated(README.read_text()) == readme.block(REPORT), "run `make readme`"


def test_the_block_reads_the_kept_verdicts():
    block = readme.block(REPORT)
    for line in REPORT.read_text().splitlines()[1:]:
        key = line.split(",", 1)[0]
        assert f"claims.md#{key})" in block
    assert block.count("\n| [") == len(REPORT.read_text().splitlines()) - 1


def test_a_readme_typed_by_hand_fails_the_check(tmp_path):
    text = README.read_text()
    # a paragraph typed in place of the block (README.md before issue 61): no block to check, a failure
    paragraph = re.sub(
        r"<!-- claims:begin.*?<!-- claims:end -->", "21 intervals cross one point", text, flags=re.S
    )
    with pytest.raises(ValueError, match="no generated claims block"):
        readme.generated(paragraph)
    typed = tmp_path / "README.md"
    typed.write_text(paragraph)
    assert readme.main(["--check", "--readme", str(typed), "--report", str(REPORT)]) == 1
    typed.write_text(text)
    assert readme.main(["--check", "--readme", str(typed), "--report", str(REPORT)]) == 0
    # one number changed by hand inside the block: the check fails, `make readme` puts it back
    first = re.search(r"\d+\.\d\d", readme.generated(text)).group(0)
    typed.write_text(text.replace(first, "9" + first, 1))
    assert readme.main(["--check", "--readme", str(typed), "--report", str(REPORT)]) == 1
    assert readme.main(["--readme", str(typed), "--report", str(REPORT)]) == 0
    assert typed.read_text() == text


def test_no_measured_number_in_the_readmes_prose():
    found = MEASURED.findall(prose(README.read_text()))
    assert not found, f"numbers typed into README.md (generate them, or point at the kept file): {found}"


def test_the_number_check_sees_a_typed_number():
    typed = "INT8 takes 0.54-0.62x FP32's time, 7m48s, 21 hours, 93%, 22 of 23 rows `make 1.5x`"
    assert MEASURED.findall(prose(typed)) == ["0.54", "0.62x", "7m48s", "21 hours", "93%", "23 rows"]
