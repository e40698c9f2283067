"""Two hundred cases of the fuzzer (``make fuzz`` runs 10,000): mutated .pte files,
loaded and run on both runtimes in child processes, each runs or raises a documented
error — none crashes, hangs or raises anything else."""

import etmlx
from fuzz import run

CASES = 200


def test_mutated_programs_run_or_raise_documented_errors(tmp_path):
    findings = []
    counts = run.fuzz(CASES, seed=7, runtimes=list(etmlx.RUNTIMES), timeout=120, work=tmp_path, report=findings.append)
    assert counts["crashed"] == counts["hung"] == counts["undocumented"] == 0, "\n".join(findings)
    assert counts["ran"] + counts["raised"] == CASES
    assert counts["ran"] > 0 and counts["raised"] > 0  # the mutations neither all fail nor all miss
