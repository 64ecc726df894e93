// The simulator's HTML report: the same charts as the live dashboard, drawn from
// the JSON the report embeds in <script type="application/json" id="sluice-data">
// (a data block: never executed, read with textContent).
'use strict';
(function () {
  const C = window.SluiceCharts;
  const data = JSON.parse(document.getElementById('sluice-data').textContent);
  const root = document.getElementById('apps');
  for (const run of data.runs) {
    for (const a of run.apps) {
      const card = C.el('div', 'card');
      card.dataset.app = a.app;
      card.appendChild(C.el('h2', null, run.name + ': ' + a.app + ' (' + a.policy + ')'));
      root.appendChild(card);
      const charts = new C.AppCharts(card, a.models, a.workers, a.reasons, { time: false });
      charts.update(a.points, a.markers || []);
    }
  }
})();
