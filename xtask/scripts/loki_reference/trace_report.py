"""Summarises a trace.py trace of the artifact's Loki on traffic analysis: where its requests are
dropped, and how far its routing tables' assumptions are from the traffic its workers get.

    python3 trace_report.py TRACE.jsonl

Prints:
- per task: requests enqueued at a worker, dropped, and the ratio;
- car requests by the budget they were given (2 x their worker's batch latency at the plan's batch
  size), enqueued and dropped;
- routing-table rebuilds against the simulated seconds (the artifact rebuilds them when a worker is
  added or removed, not at each solve);
- the rebuilds at which a detection worker had no measured car branching (the load balancer then
  takes 1 car per detection, where the trace has 18), and what those workers then received;
- car drops by the load on the car worker over 2 s windows (arrivals over its capacity), and
  within each load band by budget;
- per table, each car worker's planned arrivals against what it received. Standard library only."""
import collections
import json
import sys

WINDOW_MS = 2000


def main(path):
    enq = collections.Counter()
    drops = collections.Counter()
    car_enq_budget = collections.Counter()
    car_drop_budget = collections.Counter()
    car_arrivals = collections.Counter()   # (worker, window) -> arrivals
    car_by_budget = collections.Counter()  # (worker, window, budget) -> arrivals
    car_drops_at = collections.Counter()   # (worker, window, budget) -> drops at batch formation
    det_arrivals = []                      # (clock, worker)
    car_events = []                        # (clock, worker)
    tables = []
    end = 0.0
    for line in open(path):
        r = json.loads(line)
        kind, clock = r[0], r[1]
        end = max(end, clock)
        if kind == 'E':
            task, worker, deadline = r[2], r[3], r[5]
            enq[task] += 1
            if task == 'car_classification':
                car_enq_budget[round(deadline, 1)] += 1
                car_arrivals[(worker, int(clock // WINDOW_MS))] += 1
                car_by_budget[(worker, int(clock // WINDOW_MS), round(deadline, 1))] += 1
                car_events.append((clock, worker))
            elif task == 'object_detection':
                det_arrivals.append((clock, worker))
        elif kind == 'D':
            task, deadline, worker = r[2], r[4], r[5]
            drops[task] += 1
            if task == 'car_classification':
                car_drop_budget[round(deadline, 1)] += 1
                car_drops_at[(worker, int(clock // WINDOW_MS), round(deadline, 1))] += 1
        elif kind == 'R':
            tables.append((clock, r[2]))

    print('per task: enqueued, dropped, ratio')
    for task in sorted(enq):
        if task != 'sink':
            print(f'  {task}: {enq[task]}, {drops[task]}, {drops[task] / enq[task]:.3f}')
    print('car requests by budget (ms): enqueued, dropped, ratio')
    for budget in sorted(car_enq_budget):
        n, d = car_enq_budget[budget], car_drop_budget[budget]
        print(f'  {budget}: {n}, {d}, {d / n:.3f}')

    seconds = end / 1000
    print(f'routing tables rebuilt {len(tables)} times in {seconds:.0f} s')

    capacity = {}
    for _, rec in tables:
        capacity.update(rec['cars'])

    def rate(events, worker, t0, t1):
        return sum(1 for c, w in events if w == worker and t0 <= c < t1) / ((t1 - t0) / 1000)

    unknown = 0
    for i, (t0, rec) in enumerate(tables):
        t1 = tables[i + 1][0] if i + 1 < len(tables) else end
        if t1 <= t0:
            continue
        for w, info in rec['detectors'].items():
            if info['branching'] == 0:
                unknown += 1
                planned = rec['demand'] * rec['client'].get(w, 0)
                got = rate(det_arrivals, w, t0, t1)
                print(f'  {t0 / 1000:.1f}-{t1 / 1000:.1f} s: detection worker {w} had no measured '
                      f'branching (taken as 1 car per detection); planned {planned:.1f} req/s, '
                      f'received {got:.1f}, its cars routed to {sorted(info["cars"])}')
    print(f'rebuilds with a detection worker of unknown branching: {unknown}')

    print(f'car drops by the car worker\'s arrivals over its capacity ({WINDOW_MS} ms windows) '
          f'and by budget (ms): car requests, dropped, ratio')
    bands = [(0, 0.9), (0.9, 1.0), (1.0, 1.1), (1.1, float('inf'))]
    n_band = collections.Counter()
    d_band = collections.Counter()
    for (worker, window, budget), n in car_by_budget.items():
        cap = capacity.get(worker)
        if not cap:
            continue
        load = car_arrivals[(worker, window)] / (WINDOW_MS / 1000) / cap
        band = next(b for b in bands if b[0] <= load < b[1])
        for key in (band, (band, budget)):
            n_band[key] += n
            d_band[key] += car_drops_at.get((worker, window, budget), 0)
    for band in bands:
        if n_band[band]:
            print(f'  {band[0]}-{band[1]}: {n_band[band]}, {d_band[band]}, '
                  f'{d_band[band] / n_band[band]:.3f}')
            for budget in sorted(car_enq_budget):
                key = (band, budget)
                if n_band[key]:
                    print(f'    {budget}: {n_band[key]}, {d_band[key]}, {d_band[key] / n_band[key]:.3f}')

    print('per table (longer than 2 s): car workers planned / received req/s (capacity)')
    for i, (t0, rec) in enumerate(tables):
        t1 = tables[i + 1][0] if i + 1 < len(tables) else end
        if t1 - t0 < 2000:
            continue
        planned = collections.Counter()
        for w, info in rec['detectors'].items():
            branching = info['branching'] or 1
            for car, share in info['cars'].items():
                planned[car] += rec['demand'] * rec['client'].get(w, 0) * branching * share
        cells = []
        for car in sorted(rec['cars']):
            cells.append(f'{car} {planned[car]:.0f}/{rate(car_events, car, t0, t1):.0f} '
                         f'({rec["cars"][car]:.0f})')
        print(f'  {t0 / 1000:.0f}-{t1 / 1000:.0f} s, demand {rec["demand"]:.1f}: ' + ', '.join(cells))


if __name__ == '__main__':
    main(sys.argv[1])
