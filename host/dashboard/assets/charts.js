// sluice's charts, shared by the live dashboard (dashboard.js) and the
// simulator's HTML report (report.js), so that both draw a run the same way.
// Drawing is uPlot's (vendor/uplot); this file only shapes the data.
//
// The common currency is a *point*: one sample of one app,
//   { t: seconds since the epoch (or since the run's start),
//     arrivals, served: requests/s, on_time: 0-1, accuracy: 0-1,
//     p50_ms, p99_ms, mix: [req/s per model], queue: [length per worker],
//     drops: [req/s per reason] }
// and a *marker*: { t, kind: "swap" | "replan", label }.
//
// Every string shown is set with textContent: names come from configs, policies
// and clients, and must never be parsed as HTML.
'use strict';
(function () {
  const PALETTE = ['#1f77b4', '#ff7f0e', '#2ca02c', '#d62728', '#9467bd', '#8c564b', '#e377c2', '#7f7f7f', '#bcbd22', '#17becf'];
  const MARKER_COLOR = { swap: '#d62728', replan: '#6a3d9a' };

  /** A new element with a class and a text (never HTML). */
  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }

  /** The q-quantile (0-1) from cumulative bucket counts (`le` upper bounds, then +Inf),
   *  interpolated linearly inside the bucket, as Prometheus' histogram_quantile does. */
  function quantile(le, cumulative, q) {
    const total = cumulative[cumulative.length - 1];
    if (!(total > 0)) return null;
    const rank = q * total;
    for (let i = 0; i < le.length; i++) {
      if (cumulative[i] >= rank) {
        const lo = i === 0 ? 0 : le[i - 1];
        const below = i === 0 ? 0 : cumulative[i - 1];
        const inBucket = cumulative[i] - below;
        return inBucket > 0 ? lo + (le[i] - lo) * ((rank - below) / inBucket) : le[i];
      }
    }
    return le[le.length - 1];
  }

  // Markers: a dashed vertical line per event, drawn over the series.
  function markerPlugin(chart) {
    return {
      hooks: {
        draw: [u => {
          const ctx = u.ctx;
          ctx.save();
          ctx.lineWidth = 2 * (window.devicePixelRatio || 1);
          ctx.setLineDash([6, 4]);
          for (const m of chart.markers) {
            const x = u.valToPos(m.t, 'x', true);
            if (!(x >= u.bbox.left && x <= u.bbox.left + u.bbox.width)) continue;
            ctx.strokeStyle = MARKER_COLOR[m.kind] || '#333';
            ctx.beginPath();
            ctx.moveTo(x, u.bbox.top);
            ctx.lineTo(x, u.bbox.top + u.bbox.height);
            ctx.stroke();
          }
          ctx.restore();
        }],
      },
    };
  }

  /** One time chart: `names` series over time, optionally stacked. */
  class TimeChart {
    constructor(parent, key, title, names, opts) {
      opts = opts || {};
      this.names = names;
      this.stacked = !!opts.stacked;
      this.markers = [];
      this.root = el('div', 'chart card');
      this.root.dataset.chart = key;
      this.root.dataset.points = '0';
      this.root.dataset.markers = '0';
      this.root.appendChild(el('div', 'title', title));
      parent.appendChild(this.root);
      // The card's own width (a grid cell, once appended), less its padding.
      const width = Math.max(280, (this.root.clientWidth || 440) - 24);
      const series = [{}].concat(names.map((n, i) => ({
        label: String(n),
        stroke: PALETTE[i % PALETTE.length],
        width: 1.5,
        fill: this.stacked ? PALETTE[i % PALETTE.length] + 'aa' : undefined,
      })));
      // Rates, counts and latencies start at zero, so a stacked band or a dip reads true.
      const y = { range: opts.range || ((u, lo, hi) => [0, hi > 0 ? hi * 1.1 : 1]) };
      this.plot = new uPlot({
        width,
        height: opts.height || 170,
        series,
        scales: { x: { time: opts.time !== false }, y },
        axes: [{}, { label: opts.unit || '', size: 56 }],
        plugins: [markerPlugin(this)],
      }, [[]].concat(names.map(() => [])), this.root);
    }

    /** Draws `xs` against `ys` (one array per name) with `markers`. */
    set(xs, ys, markers) {
      let data = ys;
      if (this.stacked) {
        // Each series is drawn as the sum of itself and those after it, the widest
        // first, each filled to zero over the one before: the bands read as stacked.
        data = ys.map(() => []);
        for (let i = 0; i < xs.length; i++) {
          let sum = 0;
          for (let k = ys.length - 1; k >= 0; k--) {
            const v = ys[k][i];
            sum += (v === null || v === undefined) ? 0 : v;
            data[k][i] = sum;
          }
        }
      }
      this.markers = markers || [];
      this.root.dataset.points = String(xs.length);
      this.root.dataset.markers = String(this.markers.length);
      this.plot.setData([xs].concat(data));
    }
  }

  /** The six charts of one app: arrivals, on-time and accuracy, latency, the
   *  variant mix, queues per worker, and drops, refusals and faults. */
  class AppCharts {
    constructor(parent, models, workers, reasons, opts) {
      opts = opts || {};
      const grid = el('div', 'grid');
      parent.appendChild(grid);
      const time = opts.time !== false;
      const c = (key, title, names, o) => new TimeChart(grid, key, title, names, Object.assign({ time }, o));
      this.models = models;
      this.workers = workers;
      this.reasons = reasons;
      this.charts = {
        rate: c('rate', 'Arrivals and answers (req/s)', ['arrivals', 'served'], { unit: 'req/s' }),
        quality: c('quality', 'On-time rate and accuracy served', ['on time', 'accuracy'], { range: [0, 1] }),
        latency: c('latency', 'Latency (ms)', ['p50', 'p99'], { unit: 'ms' }),
        mix: c('mix', 'Variant mix (req/s, stacked)', models, { stacked: true, unit: 'req/s' }),
        queue: c('queue', 'Queue length per worker', workers.map(w => 'worker ' + w), {}),
        drops: c('drops', 'Drops, refusals, faults (per s)', reasons, { unit: '/s' }),
      };
    }

    /** Redraws every chart from `points` and `markers`. */
    update(points, markers) {
      const xs = points.map(p => p.t);
      const col = f => points.map(f);
      const nth = (f, n) => Array.from({ length: n }, (_, i) => col(p => { const a = f(p); return a && a[i] !== undefined ? a[i] : null; }));
      this.charts.rate.set(xs, [col(p => p.arrivals), col(p => p.served)], markers);
      this.charts.quality.set(xs, [col(p => p.on_time), col(p => p.accuracy)], markers);
      this.charts.latency.set(xs, [col(p => p.p50_ms), col(p => p.p99_ms)], markers);
      this.charts.mix.set(xs, nth(p => p.mix, this.models.length), markers);
      this.charts.queue.set(xs, nth(p => p.queue, this.workers.length), markers);
      this.charts.drops.set(xs, nth(p => p.drops, this.reasons.length), markers);
    }
  }

  window.SluiceCharts = { el, quantile, TimeChart, AppCharts, PALETTE };
})();
