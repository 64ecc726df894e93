"""Runs the artifact's run.py as quiet.py does, and writes one JSON line per event that explains
where it drops requests (TRACE_OUT=path; trace_report.py reads it):

  ["E", clock_ms, task, worker, variant, deadline_ms, queued, busy]   a request enqueued at a worker
  ["B", clock_ms, task, worker, variant, batch, queued, pipeline_batch, max_batch]   a batch started
  ["D", clock_ms, task, start_ms, deadline_ms, worker|null, queued|null, pipeline_batch|null]
                                                                       a request dropped (the worker
                                                                       when dropped at batch formation)
  ["R", clock_ms, {...}]   routing tables rebuilt: the EWMA demand of the first task, the client
                           table, each detection worker's measured car branching factor (0: none
                           yet, which the load balancer takes as 1), capacity and car table, and
                           each car worker's capacity

Worker ids are the first six hex digits of the artifact's predictor ids. Only wraps methods; the
artifact's behaviour is unchanged (its printed summary is identical with and without this)."""
import atexit
import json
import os
import runpy
import sys

QUIET = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'quiet.py')
out = open(os.environ['TRACE_OUT'], 'w')
# The artifact's run may end without closing module-level files: flush what was written.
atexit.register(out.close)
sys.path.insert(0, os.getcwd())

import core.load_balancer as lb  # noqa: E402  (needs the path above)
import core.predictor as pr  # noqa: E402
import core.simulator as sim  # noqa: E402


def emit(*record):
    out.write(json.dumps(list(record)) + '\n')


# Which worker is dropping: set while its batch-formation drop runs.
dropping = {'worker': None}
_pop = pr.Predictor.pop_while_first_expires


def pop_while_first_expires(self, clock):
    dropping['worker'] = self
    try:
        return _pop(self, clock)
    finally:
        dropping['worker'] = None


_process_batch = pr.Predictor.process_batch


def process_batch(self, clock, batch_size):
    queued = len(self.request_queue)
    result = _process_batch(self, clock, batch_size)
    emit('B', clock, self.executor.isi, self.id[:6], self.variant_name, batch_size, queued,
         self.pipeline_batch_size, self.max_batch_size)
    return result


_enqueue = pr.Predictor.enqueue_request


def enqueue_request(self, event, clock):
    emit('E', clock, self.executor.isi, self.id[:6], self.variant_name, event.deadline,
         len(self.request_queue), self.busy)
    return _enqueue(self, event, clock)


_failed = sim.Simulator.bump_failed_request_stats


def bump_failed_request_stats(self, event, clock):
    w = dropping['worker']
    emit('D', clock, event.desc, event.start_time, event.deadline, w.id[:6] if w else None,
         len(w.request_queue) if w else None, w.pipeline_batch_size if w else None)
    return _failed(self, event, clock)


_maf = lb.SimLoadBalancer.mostAccurateFirst


def most_accurate_first(self, app):
    tables, accuracy = _maf(self, app)
    if tables is not None and 'traffic_analysis' in self.simulator.apps:
        s = self.simulator
        demand = s.ewma_demand.ravel() / (s.allocation_window / 1000)
        rec = {
            'demand': float(demand[s.isi_to_idx['object_detection']]),
            'client': {w.id[:6]: p for w, p in tables['client'].get('object_detection', {}).items()},
            'detectors': {},
            'cars': {c.id[:6]: c.peak_throughput
                     for c in self.getActivePredictorsForTask('car_classification', app)},
        }
        for w, paths in tables.items():
            if w == 'client' or w.executor.isi != 'object_detection':
                continue
            rec['detectors'][w.id[:6]] = {
                'branching': self.getBranchingFactor(w, 'car_classification'),
                'capacity': w.peak_throughput,
                'cars': {c.id[:6]: p for path in paths
                         for c, p in paths[path].get('car_classification', {}).items()},
            }
        emit('R', s.clock, rec)
    return tables, accuracy


pr.Predictor.pop_while_first_expires = pop_while_first_expires
pr.Predictor.process_batch = process_batch
pr.Predictor.enqueue_request = enqueue_request
sim.Simulator.bump_failed_request_stats = bump_failed_request_stats
lb.SimLoadBalancer.mostAccurateFirst = most_accurate_first
sys.argv = [QUIET] + sys.argv[1:]
runpy.run_path(QUIET, run_name='__main__')
