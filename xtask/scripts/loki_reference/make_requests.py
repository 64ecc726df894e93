"""Poisson request arrivals on sluice's compressed diurnal day, as one file that both sluice's
simulator (`arrivals = { kind = "requests" }`) and the Loki artifact's simulator (its
`traces/maf/<app>/<app>.txt`, `arrival_ms,qos,...`) read, so the two run on the very same
requests. Standard library only; deterministic for a given seed.

    python3 make_requests.py PEAK_QPS OUT [--seed 7] [--duration 288]
"""
import argparse
import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))
DIURNAL = os.path.join(HERE, '../../../examples/experiments/loki-diurnal.txt')


def steps(path, scale):
    """The rate trace's (start second, requests/s) steps, scaled to the peak."""
    out = []
    for line in open(path):
        if line.startswith('#') or not line.strip():
            continue
        t, r = line.split()
        out.append((float(t), float(r) * scale))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('peak', type=float, help='peak requests/s (the trace is normalised to 1.0)')
    ap.add_argument('out')
    ap.add_argument('--seed', type=int, default=7)
    ap.add_argument('--duration', type=float, default=288.0, help='seconds')
    a = ap.parse_args()
    rng = random.Random(a.seed)
    s = steps(DIURNAL, a.peak)
    rows = []
    for i, (t0, rate) in enumerate(s):
        t1 = min(s[i + 1][0] if i + 1 < len(s) else a.duration, a.duration)
        t = t0
        while True:
            t += rng.expovariate(rate)
            if t >= t1:
                break
            # Whole milliseconds: the artifact reads `int(float(arrival))`.
            rows.append(int(t * 1000))
    with open(a.out, 'w') as f:
        for ms in rows:
            f.write(f'{ms},0,250\n')
    print(f'{len(rows)} requests written to {a.out}')


if __name__ == '__main__':
    main()
