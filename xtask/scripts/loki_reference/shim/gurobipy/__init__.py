"""A gurobipy stand-in on HiGHS (highspy from PyPI), so that the Loki artifact's simulator
(UMass-LIDS/Loki, src/simulator) runs without a Gurobi licence: the licence bundled with the
gurobipy wheel refuses models with quadratic terms over 200 variables, and both the artifact's
pipeline MILP (pipeline_ilp.py) and its Proteus MILP (ilp.py) multiply variables.

It covers what the artifact calls: Model, addVars, addVar, addConstr, setObjective, optimize,
status, Var.X, Expr.getValue, ObjVal, setParam (TimeLimit and MIPGap are honoured, the rest
ignored), quicksum, multidict and the GRB constants.

Products of two variables are linearised exactly when one factor is binary and the other is
bounded (z = a*b with b binary: z <= U*b, z <= a, z >= a - U*(1 - b)). U is the other
factor's upper bound, tightened first from the linear rows (sum of a*v <= u with a > 0 and
v >= 0 bounds each v by u/a), else BIG. Any other product raises.

Environment: SHIM_TIME_LIMIT (seconds) caps every solve; SHIM_LOG=1 shows HiGHS's log;
SHIM_WRITE=path writes each model before solving it.
"""
import itertools
import math
import os
import sys
import time

import highspy
import numpy as np

# Bound for the non-binary factor of a product when neither its own bound nor a linear row
# gives one.
BIG = 1.0e4
# The solution of the model solved last, for Expr.getValue (gurobipy evaluates expressions
# against the model that owns their variables; the artifact solves one model at a time).
_LAST = [None]


class GRB:
    INTEGER = 'I'
    BINARY = 'B'
    CONTINUOUS = 'C'
    MINIMIZE = 1
    MAXIMIZE = -1
    INFINITY = math.inf
    OPTIMAL = 2
    INFEASIBLE = 3

    class Status:
        OPTIMAL = 2
        INFEASIBLE = 3
        INF_OR_UNBD = 4
        UNBOUNDED = 5
        TIME_LIMIT = 9


class GurobiError(Exception):
    pass


class Expr:
    __slots__ = ('lin', 'quad', 'const')

    def __init__(self, lin=None, quad=None, const=0.0):
        self.lin = lin if lin is not None else {}
        self.quad = quad if quad is not None else {}
        self.const = const

    @staticmethod
    def of(v):
        if isinstance(v, Expr):
            return v
        if isinstance(v, Var):
            return Expr({v.idx: 1.0}, {}, 0.0)
        return Expr({}, {}, float(v))

    def getValue(self):
        sol = _LAST[0]
        v = self.const + sum(a * sol[k] for k, a in self.lin.items())
        return v + sum(a * sol[i] * sol[j] for (i, j), a in self.quad.items())

    def copy(self):
        return Expr(dict(self.lin), dict(self.quad), self.const)

    def _add(self, other, sign):
        o = Expr.of(other)
        r = self.copy()
        for k, a in o.lin.items():
            r.lin[k] = r.lin.get(k, 0.0) + sign * a
        for k, a in o.quad.items():
            r.quad[k] = r.quad.get(k, 0.0) + sign * a
        r.const += sign * o.const
        return r

    def __add__(self, o):
        return self._add(o, 1.0)

    __radd__ = __add__

    def __sub__(self, o):
        return self._add(o, -1.0)

    def __rsub__(self, o):
        return Expr.of(o)._add(self, -1.0)

    def __neg__(self):
        return self * -1.0

    def __mul__(self, o):
        if isinstance(o, (Var, Expr)):
            a, b = self, Expr.of(o)
            if a.quad or b.quad:
                raise GurobiError('cubic terms are not supported')
            r = Expr()
            for i, ca in a.lin.items():
                for j, cb in b.lin.items():
                    key = (min(i, j), max(i, j))
                    r.quad[key] = r.quad.get(key, 0.0) + ca * cb
                if b.const:
                    r.lin[i] = r.lin.get(i, 0.0) + ca * b.const
            for j, cb in b.lin.items():
                if a.const:
                    r.lin[j] = r.lin.get(j, 0.0) + cb * a.const
            r.const = a.const * b.const
            return r
        k = float(o)
        return Expr({i: a * k for i, a in self.lin.items()},
                    {i: a * k for i, a in self.quad.items()}, self.const * k)

    __rmul__ = __mul__

    def __truediv__(self, o):
        return self * (1.0 / float(o))

    def __le__(self, o):
        return TempConstr(self - o, '<')

    def __ge__(self, o):
        return TempConstr(self - o, '>')

    def __eq__(self, o):
        return TempConstr(self - o, '=')

    __hash__ = object.__hash__


class Var:
    __slots__ = ('idx', 'model', 'vtype', 'lb', 'ub', 'VarName')

    def __init__(self, model, idx, vtype, lb, ub, name):
        self.model, self.idx, self.vtype, self.lb, self.ub, self.VarName = model, idx, vtype, lb, ub, name

    @property
    def X(self):
        if self.model._sol is None:
            raise GurobiError('no solution')
        return self.model._sol[self.idx]

    x = X

    def __add__(self, o):
        return Expr.of(self) + o

    __radd__ = __add__

    def __sub__(self, o):
        return Expr.of(self) - o

    def __rsub__(self, o):
        return Expr.of(o) - Expr.of(self)

    def __neg__(self):
        return Expr.of(self) * -1.0

    def __mul__(self, o):
        return Expr.of(self) * o

    __rmul__ = __mul__

    def __truediv__(self, o):
        return Expr.of(self) * (1.0 / float(o))

    def __le__(self, o):
        return TempConstr(Expr.of(self) - o, '<')

    def __ge__(self, o):
        return TempConstr(Expr.of(self) - o, '>')

    def __eq__(self, o):
        return TempConstr(Expr.of(self) - o, '=')

    __hash__ = object.__hash__


class TempConstr:
    def __init__(self, expr, sense):
        self.expr, self.sense = expr, sense


class tupledict(dict):
    def sum(self, *pattern):
        return quicksum(self.select(*pattern))

    def select(self, *pattern):
        if not pattern:
            return list(self.values())
        out = []
        for k, v in self.items():
            kk = k if isinstance(k, tuple) else (k,)
            if all(p == '*' or p == q for p, q in zip(pattern, kk)):
                out.append(v)
        return out


def quicksum(items):
    if isinstance(items, dict):
        items = items.values()
    r = Expr()
    for it in items:
        r = r + it
    return r


def multidict(d):
    keys = list(d.keys())
    first = next(iter(d.values()), None)
    if isinstance(first, (list, tuple)):
        n = len(first)
        outs = [dict((k, d[k][i]) for k in keys) for i in range(n)]
        return [keys] + outs
    return [keys, dict(d)]


class Model:
    def __init__(self, name=''):
        self.name = name
        self.vars = []
        self.rows = []  # (lin dict, lb, ub)
        self.raw = []  # (Expr, sense) as added
        self.obj = Expr()
        self.sense = GRB.MINIMIZE
        self.status = 1
        self._sol = None
        self._prod = {}
        self.params = {}
        self.ObjVal = None

    def setParam(self, k, v):
        self.params[k] = v

    def update(self):
        pass

    def addVar(self, lb=0.0, ub=math.inf, obj=0.0, vtype=GRB.CONTINUOUS, name=''):
        if vtype == GRB.BINARY:
            lb, ub = max(lb, 0.0), min(ub, 1.0)
        v = Var(self, len(self.vars), vtype, lb, ub, name)
        self.vars.append(v)
        return v

    def addVars(self, *indices, lb=0.0, ub=math.inf, obj=0.0, vtype=GRB.CONTINUOUS, name=''):
        if len(indices) == 1:
            idx = indices[0]
            keys = list(range(idx)) if isinstance(idx, int) else list(idx)
        else:
            lists = [list(range(i)) if isinstance(i, int) else list(i) for i in indices]
            keys = list(itertools.product(*lists))
        td = tupledict()
        for k in keys:
            td[k] = self.addVar(lb=lb, ub=ub, vtype=vtype, name=f'{name}[{k}]')
        return td

    def _bound(self, v):
        return v.ub if math.isfinite(v.ub) else BIG

    def _product(self, i, j):
        """z = v_i * v_j for a binary one of the two (exact)."""
        key = (i, j)
        if key in self._prod:
            return self._prod[key]
        a, b = self.vars[i], self.vars[j]
        if b.vtype != GRB.BINARY:
            a, b = b, a
        if b.vtype != GRB.BINARY:
            raise GurobiError(f'product of non-binary variables {a.VarName} * {b.VarName}')
        if a.lb < 0:
            raise GurobiError(f'product with a variable of negative lower bound {a.VarName}')
        U = self._bound(a)
        z = self.addVar(lb=0.0, ub=U, name=f'prod[{a.VarName},{b.VarName}]')
        # z <= U b ; z <= a ; z >= a - U (1 - b)
        self.rows.append(({z.idx: 1.0, b.idx: -U}, -math.inf, 0.0))
        self.rows.append(({z.idx: 1.0, a.idx: -1.0}, -math.inf, 0.0))
        self.rows.append(({z.idx: 1.0, a.idx: -1.0, b.idx: -U}, -U, math.inf))
        self._prod[key] = z
        return z

    def _linear(self, e):
        lin = dict(e.lin)
        for (i, j), c in e.quad.items():
            if c == 0.0:
                continue
            if i == j and self.vars[i].vtype == GRB.BINARY:
                lin[i] = lin.get(i, 0.0) + c
                continue
            z = self._product(i, j)
            lin[z.idx] = lin.get(z.idx, 0.0) + c
        return {k: c for k, c in lin.items() if c != 0.0}

    def addConstr(self, tc, name=''):
        if isinstance(tc, bool):
            if not tc:
                raise GurobiError('constant constraint is false')
            return None
        # Kept as given: products are linearised at optimize(), once every row is known
        # and bounds can be tightened from the linear ones.
        self.raw.append((tc.expr, tc.sense))
        return len(self.raw) - 1

    def _tighten(self):
        """Upper bounds from linear rows Σ a·v ≤ u (or =) with a > 0 and every v ≥ 0."""
        for _ in range(3):
            for e, sense in self.raw:
                if e.quad or sense == '>':
                    continue
                rhs = -e.const
                if any(a <= 0 or self.vars[k].lb < 0 for k, a in e.lin.items()):
                    continue
                for k, a in e.lin.items():
                    b = rhs / a
                    if b < self.vars[k].ub:
                        self.vars[k].ub = max(b, self.vars[k].lb)

    def _build_rows(self):
        self.rows = []
        self._prod = {}
        self._tighten()
        for e, sense in self.raw:
            lin = self._linear(e)
            rhs = -e.const
            if sense == '<':
                self.rows.append((lin, -math.inf, rhs))
            elif sense == '>':
                self.rows.append((lin, rhs, math.inf))
            else:
                self.rows.append((lin, rhs, rhs))

    def addConstrs(self, gen, name=''):
        return [self.addConstr(c) for c in gen]

    def setObjective(self, expr, sense=GRB.MINIMIZE):
        self.obj = Expr.of(expr)
        self.sense = sense

    def optimize(self):
        if not hasattr(self, '_nuser'):
            self._nuser = len(self.vars)
        del self.vars[self._nuser:]
        self._build_rows()
        h = highspy.Highs()
        h.setOptionValue('output_flag', bool(os.environ.get('SHIM_LOG')))
        if 'TimeLimit' in self.params:
            # Only where the artifact itself limits the solve (its Proteus ILP, 500 s).
            cap = float(os.environ.get('SHIM_TIME_LIMIT', 'inf'))
            h.setOptionValue('time_limit', min(float(self.params['TimeLimit']), cap))
        if 'MIPGap' in self.params:
            h.setOptionValue('mip_rel_gap', float(self.params['MIPGap']))
        objlin = self._linear(self.obj)
        inf = highspy.kHighsInf
        n = len(self.vars)
        cost = np.zeros(n)
        for k, c in objlin.items():
            cost[k] = c
        lb = np.array([v.lb if math.isfinite(v.lb) else -inf for v in self.vars], dtype=float)
        ub = np.array([v.ub if math.isfinite(v.ub) else inf for v in self.vars], dtype=float)
        h.addVars(n, lb, ub)
        h.changeColsCost(n, np.arange(n, dtype=np.int32), cost)
        ints = [v.idx for v in self.vars if v.vtype in (GRB.INTEGER, GRB.BINARY)]
        if ints:
            h.changeColsIntegrality(len(ints), np.array(ints, dtype=np.int32),
                                    np.array([highspy.HighsVarType.kInteger] * len(ints)))
        for lin, rlb, rub in self.rows:
            idx = np.array(list(lin.keys()), dtype=np.int32)
            val = np.array(list(lin.values()), dtype=float)
            h.addRow(rlb if math.isfinite(rlb) else -inf, rub if math.isfinite(rub) else inf,
                     len(idx), idx, val)
        h.changeObjectiveSense(highspy.ObjSense.kMaximize if self.sense == GRB.MAXIMIZE
                               else highspy.ObjSense.kMinimize)
        if os.environ.get('SHIM_WRITE'):
            h.writeModel(os.environ['SHIM_WRITE'])
        t0 = time.time()
        h.run()
        ms = h.getModelStatus()
        if ms == highspy.HighsModelStatus.kTimeLimit and not h.getSolution().value_valid:
            # No incumbent yet is not infeasibility (which the artifact answers by lowering
            # its beta): give HiGHS up to ten times as long before saying so.
            h.setOptionValue('time_limit', 10 * h.getOptionValue('time_limit')[1])
            h.run()
            ms = h.getModelStatus()
        # sys.stderr.write, not print: run through quiet.py, print() is filtered.
        sys.stderr.write(f'SHIM optimize {self.name}: {len(self.vars)} vars, {len(self.rows)} '
                         f'rows, {len(ints)} integer, {time.time() - t0:.2f} s, {ms}\n')
        if ms == highspy.HighsModelStatus.kOptimal:
            self.status = GRB.Status.OPTIMAL
            self._sol = list(h.getSolution().col_value)
            self.ObjVal = h.getInfo().objective_function_value + self.obj.const
        elif ms == highspy.HighsModelStatus.kInfeasible:
            self.status = GRB.Status.INFEASIBLE
            self._sol = None
        elif ms == highspy.HighsModelStatus.kTimeLimit and h.getSolution().value_valid:
            # Gurobi stops as OPTIMAL once within MIPGap of its bound (the artifact's Proteus
            # ILP asks 50%); HiGHS's bound on the linearised products is too weak to prove
            # that in time, so an incumbent at the time limit counts as its answer.
            self.status = GRB.Status.OPTIMAL
            self._sol = list(h.getSolution().col_value)
            self.ObjVal = h.getInfo().objective_function_value + self.obj.const
        else:
            self.status = GRB.Status.INF_OR_UNBD
            self._sol = None
        _LAST[0] = self._sol
