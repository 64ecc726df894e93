#!/usr/bin/env python3
"""Cuts InfAdapter's experiment window out of its Twitter trace.

InfAdapter (§5) evaluates on a 20-minute sample of the Twitter trace: the artifact's
`auto_tuner/experiments/workload.py` takes `workload[15*86400 + 82*60 : 15*86400 +
103*60]` (1,260 one-second counts; ../shared/data/infadapter/infadapter_constants.json)
of `twitter_workload_per_second.txt` (one count per second, whitespace-separated).
This writes those counts as a sluice rate trace (`t_sec qps` lines, piecewise
constant, expanded to Poisson arrivals by the simulator).

    python3 xtask/scripts/infadapter_trace.py \
        ../shared/data/infadapter/twitter_workload_per_second.txt.gz \
        examples/experiments/infadapter-twitter.txt

Standard library only; the output is a pure function of the input.
"""

import gzip
import sys

START = 15 * 86400 + 82 * 60
END = 15 * 86400 + 103 * 60


def main(src, dst):
    opener = gzip.open if src.endswith(".gz") else open
    with opener(src, "rt") as f:
        counts = [int(x) for x in f.read().split()]
    window = counts[START:END]
    if len(window) != END - START:
        sys.exit(f"{src}: {len(counts)} seconds, the window needs {END}")
    with open(dst, "w") as out:
        out.write(
            "# InfAdapter's experiment window of the Twitter trace (requests per second):\n"
            f"# seconds {START}..{END} of twitter_workload_per_second.txt (day 15, minutes 82-103),\n"
            "# written by xtask/scripts/infadapter_trace.py; do not edit by hand.\n"
        )
        for t, c in enumerate(window):
            out.write(f"{t} {c}\n")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
