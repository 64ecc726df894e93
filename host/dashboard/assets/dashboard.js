// The live dashboard: polls GET /admin/dashboard (one JSON with everything) every
// POLL_MS with the admin token, turns two successive snapshots into one point per
// app (rates and quantiles over the interval) and draws them with charts.js.
//
// The token lives in the `token` variable of this closure only: it is never put in
// a URL, a cookie or web storage, so a reload or a closed tab forgets it.
'use strict';
(function () {
  const C = window.SluiceCharts;
  const el = C.el;
  /** How often the page asks; the bound is one second behind the host. */
  const POLL_MS = 500;
  /** Points kept per app: five minutes at POLL_MS. */
  const KEEP = 600;
  /**
   * Outcomes drawn in the drops chart (sluice_requests_total's), then faults: the
   * host's list (the snapshot's unserved_outcomes, rendered from its drop and
   * refusal types), read at each poll so the page names no outcome itself.
   */
  let reasons = [];
  const COUNTERS = ['accepted', 'served', 'late', 'dropped', 'rejected', 'faults', 'swaps'];

  let token = null;
  let timer = null;
  let since = 0;
  let polls = 0;
  const apps = new Map();
  const pipelineSeen = new Map();
  const $ = id => document.getElementById(id);

  function setConn(cls, text) {
    const c = $('conn');
    c.className = 'pill ' + cls;
    c.textContent = text;
  }

  $('login').addEventListener('submit', ev => {
    ev.preventDefault();
    token = $('token').value;
    $('token').value = '';
    $('login-error').textContent = '';
    poll();
  });
  $('signout').addEventListener('click', () => signOut(''));

  function signOut(message) {
    token = null;
    if (timer) clearTimeout(timer);
    timer = null;
    $('main').hidden = true;
    $('signout').hidden = true;
    $('login').hidden = false;
    $('login-error').textContent = message || '';
    setConn('', 'signed out');
  }

  async function api(method, path, body) {
    const r = await fetch(path, {
      method,
      headers: { 'Authorization': 'Bearer ' + token, 'Content-Type': 'application/json' },
      body: body === undefined ? undefined : JSON.stringify(body),
      cache: 'no-store',
      credentials: 'omit',
      referrerPolicy: 'no-referrer',
    });
    let json = null;
    try { json = await r.json(); } catch (e) { json = null; }
    return { status: r.status, body: json };
  }

  async function poll() {
    if (timer) clearTimeout(timer);
    timer = null;
    if (token === null) return;
    let r;
    try {
      r = await api('GET', '/admin/dashboard?since=' + since);
    } catch (e) {
      setConn('down', 'host unreachable');
      schedule();
      return;
    }
    if (token === null) return;
    if (r.status === 401 || r.status === 403) {
      signOut((r.body && r.body.error) || ('refused: HTTP ' + r.status));
      return;
    }
    if (r.status !== 200 || !r.body) {
      setConn('down', 'HTTP ' + r.status);
      schedule();
      return;
    }
    $('login').hidden = true;
    $('main').hidden = false;
    $('signout').hidden = false;
    setConn('live', 'live');
    render(r.body);
    polls++;
    document.body.dataset.polls = String(polls);
    $('updated').textContent = 'updated ' + new Date(r.body.unix_ms).toLocaleTimeString();
    schedule();
  }

  function schedule() {
    if (token !== null) timer = setTimeout(poll, POLL_MS);
  }

  function render(s) {
    const t = s.unix_ms / 1000;
    reasons = s.unserved_outcomes;
    for (const a of s.apps) renderApp(a, t);
    for (const e of s.events) {
      since = Math.max(since, e.seq);
      const m = { t: e.unix_ms / 1000, kind: e.kind, label: e.kind + ' ' + e.app + ': ' + e.detail };
      if (e.kind === 'swap') {
        const a = apps.get(e.app);
        if (a) addMarker(a, m);
      } else {
        for (const a of apps.values()) addMarker(a, m);
      }
    }
    renderAllocation(s.allocation, s.apps);
    renderPipelines(s.pipelines, t);
    renderEvaluations(s.evaluations, s.apps);
    renderCluster(s);
    for (const a of apps.values()) a.charts.update(a.points, a.markers);
  }

  function addMarker(a, m) {
    a.markers.push(m);
    const li = el('li', null, new Date(m.t * 1000).toLocaleTimeString() + ' ' + m.label);
    li.dataset.kind = m.kind;
    a.events.prepend(li);
  }

  function field(parent, label, key) {
    const span = el('span');
    span.appendChild(el('span', 'muted', label + ' '));
    const v = el('b');
    v.dataset.field = key;
    span.appendChild(v);
    parent.appendChild(span);
    return v;
  }

  function createApp(a) {
    const card = el('div', 'card');
    card.dataset.app = a.app;
    card.appendChild(el('h2', null, 'App ' + a.app));
    const row = el('div', 'row');
    card.appendChild(row);
    const f = {};
    for (const [label, key] of [['policy', 'policy'], ['digest', 'digest'], ['generation', 'generation'], ['load (req/s)', 'load_qps'], ['queued', 'queued'], ['SLO (ms)', 'slo_ms'], ['unbound', 'unbound_reason']]) {
      f[key] = field(row, label, key);
    }
    const table = el('table');
    const head = el('tr');
    const body = el('tr');
    for (const k of COUNTERS) {
      head.appendChild(el('th', null, k));
      const td = el('td');
      td.dataset.field = k;
      f[k] = td;
      body.appendChild(td);
    }
    table.appendChild(head);
    table.appendChild(body);
    card.appendChild(table);
    card.appendChild(el('div', 'muted', 'params'));
    f.params = card.appendChild(el('pre'));
    f.params.dataset.field = 'params';
    card.appendChild(el('div', 'muted', "the policy's status, per worker"));
    f.status = card.appendChild(el('pre'));
    f.status.dataset.field = 'policy_status';
    card.appendChild(el('div', 'muted', 'swaps and re-plans'));
    const events = card.appendChild(el('ul', 'events'));
    $('apps').appendChild(card);
    const models = a.models.map(m => m.name);
    const workers = a.workers.map(w => w.index);
    // An app's chart keeps the outcomes it was created with: its series are fixed.
    const drawn = reasons.slice();
    const charts = new C.AppCharts(card, models, workers, drawn.concat(['policy faults']));
    const entry = { card, f, events, charts, models, reasons: drawn, points: [], markers: [], prev: null };
    apps.set(a.app, entry);
    return entry;
  }

  function renderApp(a, t) {
    const e = apps.get(a.app) || createApp(a);
    for (const k of ['policy', 'digest', 'generation', 'queued', 'slo_ms']) e.f[k].textContent = String(a[k]);
    e.f.load_qps.textContent = Number(a.load_qps).toFixed(1);
    e.f.unbound_reason.textContent = a.unbound_reason === null ? '-' : String(a.unbound_reason);
    for (const k of COUNTERS) e.f[k].textContent = String(a.counters[k]);
    e.f.params.textContent = JSON.stringify(a.params, null, 1);
    e.f.status.textContent = a.workers.map(w => 'worker ' + w.index + ': ' + JSON.stringify(w.policy_status)).join('\n');
    const p = e.prev;
    e.prev = { t, a };
    if (!p || t <= p.t) return;
    const dt = t - p.t;
    const d = k => (a.counters[k] - p.a.counters[k]);
    const out = k => (a.outcomes[k] || 0) - (p.a.outcomes[k] || 0);
    const answered = d('served') + d('late') + d('dropped') + d('rejected');
    const byModel = e.models.map(m => (a.served_by_model[m] || 0) - (p.a.served_by_model[m] || 0));
    const servedAll = byModel.reduce((x, y) => x + y, 0);
    const acc = servedAll > 0 ? a.models.reduce((s, m, i) => s + byModel[i] * m.accuracy, 0) / servedAll : null;
    const lb = a.latency_buckets;
    const delta = lb.counts.map((c, i) => c - p.a.latency_buckets.counts[i]);
    const q = x => { const v = C.quantile(lb.le, delta, x); return v === null ? null : v * 1e3; };
    e.points.push({
      t,
      arrivals: (d('accepted') + d('rejected')) / dt,
      served: (d('served') + d('late')) / dt,
      on_time: answered > 0 ? d('served') / answered : null,
      accuracy: acc,
      p50_ms: q(0.5),
      p99_ms: q(0.99),
      mix: byModel.map(x => x / dt),
      queue: a.queue_lengths,
      drops: e.reasons.map(r => out(r) / dt).concat([d('faults') / dt]),
    });
    if (e.points.length > KEEP) e.points.shift();
  }

  function table(headers, rows) {
    const t = el('table');
    const h = el('tr');
    for (const x of headers) h.appendChild(el('th', null, x));
    t.appendChild(h);
    for (const r of rows) {
      const tr = el('tr');
      for (const x of r) tr.appendChild(el('td', null, x === null || x === undefined ? '-' : x));
      t.appendChild(tr);
    }
    return t;
  }

  // The allocator's view nests its plan under the solver's name; find by shape.
  function find(obj, pred, depth) {
    if (depth > 6 || obj === null || typeof obj !== 'object') return undefined;
    if (pred(obj)) return obj;
    for (const v of Object.values(obj)) {
      const f = find(v, pred, (depth || 0) + 1);
      if (f !== undefined) return f;
    }
    return undefined;
  }

  function renderAllocation(v, appViews) {
    const box = $('allocation');
    if (!v) return;
    box.className = '';
    box.replaceChildren();
    const plan = find(v.allocation, o => Array.isArray(o.devices) && o.devices.length > 0 && o.devices[0] && 'device' in o.devices[0], 0);
    const last = v.allocation || {};
    const row = el('div', 'row');
    row.appendChild(el('span', null, 'status: ' + (last.status === undefined ? '-' : last.status)));
    row.appendChild(el('span', null, 'solve time: ' + (last.solve_seconds === undefined ? '-' : (last.solve_seconds * 1e3).toFixed(1) + ' ms')));
    const gap = find(last, o => 'gap' in o || 'mip_gap' in o, 0);
    row.appendChild(el('span', null, 'gap: ' + (gap ? String(gap.gap !== undefined ? gap.gap : gap.mip_gap) : '-')));
    box.appendChild(row);
    const measured = {};
    for (const a of appViews) measured[a.app] = a.load_qps;
    box.appendChild(el('h3', null, 'Demand: planned against measured (req/s)'));
    box.appendChild(table(['app', 'planned', 'measured'], Object.entries(v.demand_qps || {}).map(([app, q]) => [app, Number(q).toFixed(1), measured[app] === undefined ? '-' : Number(measured[app]).toFixed(1)])));
    if (plan) {
      box.appendChild(el('h3', null, 'Devices × variants'));
      box.appendChild(table(['device', 'type', 'app', 'variant', 'share'], plan.devices.map(d => [d.device, d.device_type, d.app, d.model, (100 * (d.share || 0)).toFixed(0) + ' %'])));
    }
    box.appendChild(el('h3', null, 'Last plans'));
    box.appendChild(table(['reason', 'status', 'solve (ms)', 'accuracy', 'devices'], (v.history || []).slice().reverse().map(h => [
      h.reason, h.status, h.solve_seconds === undefined ? null : (h.solve_seconds * 1e3).toFixed(1),
      h.effective_accuracy === null || h.effective_accuracy === undefined ? null : Number(h.effective_accuracy).toFixed(3),
      JSON.stringify(h.devices)])));
  }

  function renderPipelines(ps, t) {
    const box = $('pipelines');
    if (!ps || ps.length === 0) return;
    box.className = '';
    box.replaceChildren();
    for (const p of ps) {
      const card = el('div', 'card');
      card.dataset.pipeline = p.name;
      card.appendChild(el('h3', null, 'Pipeline ' + p.name));
      // A re-plan shows as a new last entry in the pipeline's plan history.
      const hist = p.history || (p.plan_view && p.plan_view.history) || [];
      const key = hist.length + ':' + JSON.stringify(hist[hist.length - 1] || null);
      const seen = pipelineSeen.get(p.name);
      if (seen !== undefined && seen !== key) {
        for (const a of apps.values()) addMarker(a, { t, kind: 'replan', label: 'replan pipeline ' + p.name });
      }
      pipelineSeen.set(p.name, key);
      const tasks = p.tasks || [];
      card.appendChild(table(['task', 'created', 'served', 'dropped', 'rejected', 'rerouted', 'drops by reason'], tasks.map(x => [x.task, x.created, x.served, x.dropped, x.rejected, x.rerouted, JSON.stringify(x.dropped_by_reason)])));
      if (Array.isArray(p.fanout) && p.fanout.length) {
        card.appendChild(el('div', 'muted', 'fan-outs'));
        card.appendChild(table(['task', 'variant', 'child', 'expected', 'measured', 'requests'], p.fanout.map(f => [f.task, f.variant, f.child, f.expected, f.measured === null ? null : Number(f.measured).toFixed(2), f.requests])));
      }
      if (p.routing !== undefined) {
        card.appendChild(el('div', 'muted', 'routing tables in force'));
        card.appendChild(el('pre', null, JSON.stringify(p.routing, null, 1)));
      }
      if (Array.isArray(p.devices)) {
        card.appendChild(el('div', 'muted', 'devices'));
        card.appendChild(table(['device', 'task', 'variant', 'batch', 'latency (µs)', 'requests'], p.devices.map((d, i) => d ? [String(i), d.task, d.variant, d.batch, d.latency_us, d.requests] : [String(i), 'idle', null, null, null, null])));
      }
      box.appendChild(card);
    }
  }

  let evalAppsKey = '';
  function renderEvaluations(evs, appViews) {
    const key = appViews.map(a => a.app).join('\n');
    if (key !== evalAppsKey) {
      evalAppsKey = key;
      const sel = $('eval-app');
      sel.replaceChildren();
      for (const a of appViews) {
        const o = el('option', null, a.app);
        o.value = a.app;
        sel.appendChild(o);
      }
    }
    const box = $('evaluations');
    box.replaceChildren();
    for (const e of evs.slice().reverse()) {
      const card = el('div', 'card');
      card.dataset.evaluation = String(e.id);
      card.appendChild(el('h3', null, 'Evaluation ' + e.id + ' of ' + e.app + ': ' + e.status + (e.status === 'running' ? ' (' + Math.round(100 * e.progress) + ' %)' : '')));
      if (e.error) card.appendChild(el('div', 'error', e.error));
      const r = e.result;
      if (r) {
        const rows = [['policy', r.candidate.policy, r.current.policy, '']];
        for (const k of ['requests', 'served', 'on_time', 'dropped', 'accuracy', 'violation_rate', 'p50_ms', 'p99_ms', 'faults']) {
          const dv = r.difference[k];
          rows.push([k, fmt(r.candidate[k]), fmt(r.current[k]), dv === undefined ? '' : fmt(dv)]);
        }
        card.appendChild(table(['', 'candidate', 'current', 'difference'], rows));
        card.appendChild(el('div', 'muted', 'per minute: accuracy and violation rate, candidate | current'));
        const side = (r.candidate.series || []).map((c, i) => {
          const k = (r.current.series || [])[i] || {};
          return [String(c.start_s) + ' s', fmt(c.accuracy) + ' | ' + fmt(k.accuracy), fmt(c.violation_rate) + ' | ' + fmt(k.violation_rate), c.requests];
        });
        card.appendChild(table(['minute', 'accuracy', 'violations', 'requests'], side));
      }
      const verdict = e.promotion ? e.promotion.reason : (r ? 'no promotion rule was asked' : '');
      if (verdict) card.appendChild(el('div', e.promotion && e.promotion.promoted ? 'verdict-promote' : 'verdict-keep', verdict));
      if (r && !(e.promotion && e.promotion.promoted)) {
        // Promotion goes through the API's own rule: the same request again with
        // promote_if, so the replay, the verdict and the generation check all hold.
        const b = el('button', null, 'Re-check and promote');
        b.type = 'button';
        b.addEventListener('click', () => startEvaluation(e.app, Object.assign({}, e.request, { promote_if: promoteRule() })));
        card.appendChild(b);
      }
      box.appendChild(card);
    }
  }

  function fmt(x) {
    if (x === null || x === undefined) return '-';
    return typeof x === 'number' && !Number.isInteger(x) ? x.toFixed(3) : String(x);
  }

  function promoteRule() {
    return { accuracy_gain_min: 0, violation_max: 0.05 };
  }

  async function startEvaluation(app, request) {
    $('eval-error').textContent = '';
    const r = await api('POST', '/admin/apps/' + encodeURIComponent(app) + '/evaluate', request);
    if (r.status !== 202) $('eval-error').textContent = (r.body && r.body.error) || ('HTTP ' + r.status);
    poll();
  }

  $('evaluate').addEventListener('submit', ev => {
    ev.preventDefault();
    let params;
    try { params = JSON.parse($('eval-params').value || '{}'); } catch (e) {
      $('eval-error').textContent = 'params: ' + e.message;
      return;
    }
    const request = { policy: $('eval-policy').value, params };
    if ($('eval-promote').checked) request.promote_if = promoteRule();
    startEvaluation($('eval-app').value, request);
  });

  function renderCluster(s) {
    const c = s.cluster || { role: 'standalone' };
    $('host').replaceChildren(table(['role', 'version', 'apps', 'connections open'], [[c.role, s.version, String(s.apps.length), String(s.connections_open)]]));
    // A cluster's frontend says what it sees of the cluster; a standalone host has
    // no cluster card.
    const section = $('cluster-section');
    section.hidden = c.role === 'standalone';
    if (section.hidden) return;
    const box = $('cluster');
    box.replaceChildren();
    const row = el('div', 'row');
    const item = (label, key, value) => {
      const span = el('span');
      span.appendChild(el('span', 'muted', label + ' '));
      const b = span.appendChild(el('b', null, value === null || value === undefined ? '-' : value));
      b.dataset.cluster = key;
      row.appendChild(span);
    };
    item('this host:', 'self', c.role + ' ' + (c.id || ''));
    item('leading allocator:', 'leader', c.leader === null || c.leader === undefined ? 'none' : c.leader);
    item('routing epoch:', 'epoch', c.routing_epoch);
    const store = c.store || {};
    item('store:', 'store', (store.reachable ? 'reachable' : 'unreachable, showing the last state seen') + ' (revision ' + store.revision + ')');
    item('tables applied:', 'swaps', c.swaps);
    item('agents dropped before a re-plan:', 'agent_removals', c.agent_removals);
    item('batches retried:', 'retried', c.retried);
    box.appendChild(row);
    const agents = c.agents || [];
    const roles = [];
    if (c.leader !== null && c.leader !== undefined) roles.push(['allocator', c.leader, '-', 'leader']);
    for (const f of c.frontends || []) roles.push(['frontend', f.id, f.addr, 'routing epoch ' + f.routing_epoch + (f.this ? ' (this one)' : '')]);
    for (const a of agents) roles.push(['agent', a.id, a.addr, a.health + (a.accepting ? '' : ', not accepting') + ', ready epoch ' + (a.ready_epoch === null ? '-' : a.ready_epoch)]);
    box.appendChild(el('h3', null, 'Roles'));
    const rt = box.appendChild(table(['role', 'id', 'address', 'state'], roles));
    rt.dataset.cluster = 'roles';
    box.appendChild(el('h3', null, 'Agents and their devices'));
    const devices = [];
    for (const a of agents) {
      if (!a.devices.length) devices.push([a.id, '-', '-', a.health, '-']);
      for (const d of a.devices) {
        devices.push([a.id, String(d.index), d.kind,
          d.loaded.map(l => l.app + ' ' + l.variant).join(', ') || '-',
          d.routes.map(r => r.app + ' ' + r.variant + ' ' + (100 * r.share).toFixed(0) + ' %').join(', ') || '-']);
      }
    }
    const dt = box.appendChild(table(['agent', 'device', 'type', 'loaded', 'routes (share of the app)'], devices));
    dt.dataset.cluster = 'devices';
  }
})();
