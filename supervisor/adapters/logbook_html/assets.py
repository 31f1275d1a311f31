"""The HTML logbook's inline style sheet and script (the page fetches nothing; its CSP allows only
inline code). The script filters the event table by kind and by text."""

CSS = """
:root{--fg:#1d2125;--muted:#5f6b76;--bg:#fff;--line:#d0d7de;--ok:#2f9e44;--fault:#c92a2a;--queue:#ffd43b;
--spike:#f08c00;--rollback:#7048e8;--note:#1c7ed6;--card:#f6f8fa}
*{box-sizing:border-box}body{margin:0;font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;color:var(--fg);
background:var(--bg)}main{max-width:1100px;margin:0 auto;padding:18px 22px 60px}
h1{font-size:24px;margin:4px 0}h2{font-size:18px;margin:26px 0 8px;border-bottom:1px solid var(--line);
padding-bottom:4px}h3{font-size:15px;margin:18px 0 4px}h4{font-size:14px;margin:16px 0 4px}
.muted{color:var(--muted)}.caveat{background:#fff9db;border-left:3px solid var(--queue);padding:4px 8px;margin:6px 0}
.chips{display:flex;flex-wrap:wrap;gap:8px;margin:10px 0}.chip{background:var(--card);border:1px solid var(--line);
border-radius:6px;padding:6px 10px;min-width:92px}.chip span{display:block;font-size:11px;color:var(--muted);
text-transform:uppercase;letter-spacing:.04em}.chip b{font-size:17px}
svg.chart{width:100%;height:auto;display:block;margin:6px 0}svg text{font-size:11px;fill:var(--muted)}
svg .lane{fill:var(--fg);font-size:12px}svg .axis{stroke:var(--muted)}svg .grid{stroke:var(--line);stroke-dasharray:2 3}
.bar rect{stroke:none}.bar.queue rect{fill:var(--queue);opacity:.7}.bar.run.ok rect{fill:var(--ok)}
.bar.run.fault rect{fill:#e03131;opacity:.85}.bar.run.other rect{fill:#868e96}.bar text{fill:#fff;font-size:11px}
.mark line{stroke-width:1.5}.mark.fault line{stroke:var(--fault)}.mark.fault circle{fill:var(--fault)}
.mark.spike line{stroke:var(--spike);stroke-dasharray:4 2}.mark.spike circle{fill:var(--spike)}
.mark.rollback line{stroke:var(--rollback)}.mark.rollback circle{fill:var(--rollback)}
.mark.note line{stroke:var(--note);stroke-dasharray:1 3}.mark.note circle{fill:var(--note)}
.mark.end line{stroke:var(--fg)}.mark.end circle{fill:var(--fg)}
polyline.line{fill:none;stroke-width:1.4}polyline.loss{stroke:#1c7ed6}polyline.throughput{stroke:#2f9e44}
.legend{font-size:12px;color:var(--muted)}.key{display:inline-block;width:12px;height:12px;margin:0 4px 0 12px;
vertical-align:-2px;border-radius:2px}.key.queue{background:var(--queue)}.key.run.ok{background:var(--ok)}
.key.run.fault{background:#e03131}.key.fault{background:var(--fault);width:3px}.key.spike{background:var(--spike);
width:3px}.key.rollback{background:var(--rollback);width:3px}.key.note{background:var(--note);width:3px}
table{border-collapse:collapse;width:100%;margin:8px 0;font-size:13px}th,td{border-bottom:1px solid var(--line);
padding:4px 6px;text-align:left;vertical-align:top}th{background:var(--card)}td.t{white-space:nowrap}
code{background:var(--card);padding:0 3px;border-radius:3px;font-size:12px}blockquote{margin:6px 0;padding:4px 10px;
border-left:3px solid var(--note);background:var(--card)}#chronicle li{margin:2px 0}
.k{font-family:ui-monospace,monospace;font-size:12px;padding:0 4px;border-radius:3px;background:var(--card)}
.k.fault,.k.gave_up,.k.mass_fault{background:#ffe3e3}.k.note{background:#e7f5ff}.k.started,.k.completed{background:#ebfbee}
details summary{cursor:pointer;color:var(--muted);font-size:12px}pre{white-space:pre-wrap;font-size:12px;margin:4px 0}
.filters input{padding:4px 6px;width:260px}.filters select{padding:4px}tr[hidden]{display:none}
"""

JS = """
(function () {
  var q = document.getElementById("q"), kind = document.getElementById("kind");
  var shown = document.getElementById("shown");
  if (!q || !kind || !shown) { return; }
  var rows = Array.prototype.slice.call(document.querySelectorAll("#events tbody tr"));
  var text = rows.map(function (r) { return r.textContent.toLowerCase(); });
  function apply() {
    var t = q.value.toLowerCase(), k = kind.value, n = 0;
    rows.forEach(function (r, i) {
      var ok = (!k || r.getAttribute("data-kind") === k) && (!t || text[i].indexOf(t) >= 0);
      r.hidden = !ok;
      if (ok) { n += 1; }
    });
    shown.textContent = String(n);
  }
  q.addEventListener("input", apply);
  kind.addEventListener("change", apply);
  document.documentElement.setAttribute("data-ready", "1");
})();
"""
