"""Regenerate the stored expected simulator summaries (only on purpose, after a change that is
meant to alter scheduling decisions or timing; say which and why in the commit message):

  python -m tests.sim.regenerate_expected
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

from tests.sim.test_sim_runs import EXPECTATION_POLICIES, EXPECTED, expectation_run


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for policy in EXPECTATION_POLICIES:
            summary = expectation_run(Path(tmp), policy)
            path = EXPECTED / f"small_{policy}.json"
            path.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
            print(f"wrote {path}")


if __name__ == "__main__":
    main()
