"""Runs the artifact's run.py with print() kept to its summary lines: it prints every request
(hundreds of MB per run), and writing that costs more than a third of the run's time.

Predictor.batch_processing_latency is replaced by the same table lookup without its two
log.debug calls: their f-strings format the whole latency table on every call even with debug
logging off, and that was most of the Proteus run's time (py-spy)."""
import builtins
import os
import runpy
import sys

KEEP = ('Overall', 'Total parent', 'Total requests:', 'Dropped requests', 'Late requests',
        'Total SLO', 'SLO violations per ISI', 'Testing step')
_print = builtins.print
# LOKI_DROPS=path: the client (parent request) of every dropped request, one per line, so
# that the client-level violation ratio sluice reports can be computed for the artifact too
# (it drops late requests when a batch is formed, so nothing it serves is late).
_drops = open(os.environ['LOKI_DROPS'], 'w') if os.environ.get('LOKI_DROPS') else None


def quiet(*args, **kwargs):
    if not args or not isinstance(args[0], str):
        return
    line = args[0]
    if line.startswith(KEEP):
        _print(*args, **kwargs)
    elif _drops is not None and line.startswith('QUERY_DROPPED'):
        parent = line.split('parent_request_id: ', 1)[1].split(',', 1)[0]
        _drops.write(parent + '\n')


builtins.print = quiet
# As `python run.py` would: its imports (core, algorithms) are relative to its directory.
sys.path.insert(0, os.getcwd())

import core.predictor  # noqa: E402  (needs the path above)


def batch_processing_latency(self, batch_size, request):
    return self.profiled_latencies[(request.desc, self.variant_name, batch_size)]


core.predictor.Predictor.batch_processing_latency = batch_processing_latency
sys.argv = ['run.py'] + sys.argv[1:]
runpy.run_path('run.py', run_name='__main__')
