"""tests/durations.json from a run of `bash scripts/test.sh --durations=0 > OUT`: the seconds each test
file took in the side-by-side part, which scripts/test.sh's shards are balanced by (tests/conftest.py).

    bash scripts/test.sh --durations=0 > /tmp/suite.txt; .venv/bin/python scripts/durations.py /tmp/suite.txt
"""

from __future__ import annotations

import json
import re
import sys
from collections import defaultdict
from pathlib import Path

LINE = re.compile(r"^\s*([0-9.]+)s\s+(call|setup|teardown)\s+(\S+?)::")
SERIAL_PART = "now the tests marked serial"  # scripts/test.sh's line between the two parts


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    seconds: dict[str, float] = defaultdict(float)
    for line in Path(argv[0]).read_text(errors="replace").splitlines():
        if SERIAL_PART in line:
            break
        m = LINE.match(line)
        if m:
            seconds[m.group(3)] += float(m.group(1))
    if not seconds:
        print(f"error: no per-test durations in {argv[0]} (run scripts/test.sh with --durations=0)", file=sys.stderr)
        return 1
    out = Path(__file__).resolve().parents[1] / "tests" / "durations.json"
    out.write_text(json.dumps({k: round(v, 1) for k, v in sorted(seconds.items())}, indent=0) + "\n")
    print(f"wrote {out}: {len(seconds)} files, {sum(seconds.values()):.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
