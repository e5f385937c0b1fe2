"""tools/fuzz.py (the long run) itself: every kind of misbehaving case is caught, pinned to its case and saved.

The `selftest` target misbehaves on purpose, each case in the way its bytes pick: it accepts,
rejects, raises a foreign exception, hangs in Python, segfaults, or blocks the alarm and hangs.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tools import fuzz as long_run
from tools.fuzz_targets import mutate, self_test_behaviour, source_bytes

REPO = Path(__file__).resolve().parents[2]

CASES = 11  # seed 0 gives every behaviour among the first 11 cases, the slow "stuck" one once
FINDING_KIND = {"error": "ValueError", "python hang": "CaseTimeout", "segfault": "crash", "stuck": "hang"}


def test_every_misbehaviour_is_found_and_saved(tmp_path):
    result = subprocess.run([sys.executable, "-m", "tools.fuzz", "--cases", str(CASES), "--targets",
                             "selftest", "--case-seconds", "1", "--out", str(tmp_path)],
                            capture_output=True, text=True, timeout=600, check=False, cwd=REPO)
    behaviours = {}
    for number in range(CASES):
        case = long_run.plan(number, ["selftest"], seed=0)
        behaviours[number] = self_test_behaviour(mutate(source_bytes(case.source), case.mutations))
    assert set(behaviours.values()) == {"accept", "reject", "error", "python hang", "segfault", "stuck"}
    expected = {n: FINDING_KIND[b] for n, b in behaviours.items() if b in FINDING_KIND}
    found = {}
    for note in tmp_path.glob("selftest-case*.json"):
        record = json.loads(note.read_text())
        number = int(record["case"].split(":")[1])
        found[number] = record["kind"]
        case = long_run.plan(number, ["selftest"], seed=0)
        assert note.with_suffix(".bin").read_bytes() == mutate(source_bytes(case.source), case.mutations)
    assert found == expected
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"{CASES} cases" in result.stdout and f"{len(expected)} findings" in result.stdout
