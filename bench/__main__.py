"""``make bench``: run every benchmark (each ``bench/<part>/`` package) and print one table.

  python -m bench [--only part,part] [--list]

Each part runs in its own process (so one failing part does not stop the
others) and merges its rows into ``bench/results.json``; the combined table
of this run is printed at the end.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from bench.report import RESULTS, Row, stamp, table

HERE = Path(__file__).parent


def parts() -> list[str]:
    return sorted(p.name for p in HERE.iterdir() if (p / "__main__.py").exists())


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("--only", default="", help="comma-separated parts")
    parser.add_argument("--list", action="store_true")
    args = parser.parse_args()
    chosen = [p for p in parts() if not args.only or p in args.only.split(",")]
    if args.list:
        print("\n".join(chosen))
        return 0
    started = time.time()
    failed = []
    for index, part in enumerate(chosen, 1):
        print(f"==> [{index}/{len(chosen)}] bench.{part}", flush=True)
        code = subprocess.call([sys.executable, "-m", f"bench.{part}"], cwd=HERE.parent)
        if code != 0:
            failed.append(part)
            print(f"    bench.{part} exited with {code}", flush=True)
    doc = json.loads(RESULTS.read_text()) if RESULTS.exists() else {"rows": []}
    fields = set(Row.__dataclass_fields__)
    rows = [Row(**{k: v for k, v in r.items() if k in fields})
            for r in doc["rows"] if float(r.get("at", 0)) >= started]
    print("\n" + table(rows))
    print(stamp(started))
    print(f"\nwritten to {RESULTS.relative_to(HERE.parent)}"
          + (f"; failed parts: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
