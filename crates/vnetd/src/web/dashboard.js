// The vnet dashboard: reads /api/state.json every 5 s and draws it. Hand
// written, no library; text goes in with textContent and attributes with
// setAttribute only (names come from peers and the store). When a state was
// drawn without an exception, #ok is in the page; when anything failed,
// #error says what (the lab's headless-browser test reads both).
"use strict";
(function () {
  var SVG = "http://www.w3.org/2000/svg";
  var PERIOD_MS = 5000, WINDOW_MS = 5 * 60 * 1000;
  var history = [];

  function $(id) { return document.getElementById(id); }
  function el(tag, attrs, text) {
    var e = tag.indexOf("svg:") === 0 ? document.createElementNS(SVG, tag.slice(4)) : document.createElement(tag);
    for (var k in attrs || {}) { e.setAttribute(k, String(attrs[k])); }
    if (text !== undefined) { e.textContent = String(text); }
    return e;
  }
  // A map keyed by names from peers and the store: no prototype, so a host
  // named "constructor" or "toString" finds nothing built in.
  function dict() { return Object.create(null); }
  function clear(e) { while (e.firstChild) { e.removeChild(e.firstChild); } return e; }
  function need(ok, what) { if (!ok) { throw new Error("bad state document: " + what); } }
  function bytes(n) {
    var u = ["B", "KB", "MB", "GB", "TB"], i = 0;
    n = Number(n) || 0;
    while (n >= 1000 && i < u.length - 1) { n /= 1000; i++; }
    return (i ? n.toFixed(1) : String(n)) + " " + u[i];
  }
  function marker(id, text) {
    var s = $("status");
    ["ok", "error"].forEach(function (m) { var e = $(m); if (e) { e.parentNode.removeChild(e); } });
    s.appendChild(el("div", { id: id }, text));
  }
  function failed(msg) { marker("error", "dashboard error: " + msg); }
  window.onerror = function (msg) { failed(String(msg)); };
  window.addEventListener("unhandledrejection", function (e) { failed(String(e.reason)); });

  function table(t, head, rows) {
    clear(t);
    var tr = el("tr");
    head.forEach(function (h) { tr.appendChild(el("th", {}, h)); });
    t.appendChild(tr);
    rows.forEach(function (r) {
      var row = el("tr");
      r.forEach(function (c) {
        row.appendChild(typeof c === "number" ? el("td", { "class": "n" }, c) : el("td", {}, c));
      });
      t.appendChild(row);
    });
    if (!rows.length) { t.appendChild(el("tr")).appendChild(el("td", { colspan: head.length }, "none")); }
  }

  // A link's look: its path (direct, punched, roamed, relayed), security, state.
  function look(l) {
    var path = l.path || "direct", sec = l.security || "plain";
    var color = l.state === "down" ? "#c62828" : { punched: "#1565c0", relayed: "#ef6c00" }[path] || "#2e7d32";
    var dash = { punched: "8 4", relayed: "2 4", roamed: "8 4" }[path] || "";
    var heard = l.last_rx_ms < 0 ? "never heard" : "heard " + (l.last_rx_ms / 1000).toFixed(1) + " s ago";
    return { path: path, sec: sec === "encrypt" ? "encrypted" : sec, color: color, dash: dash, heard: heard };
  }

  // The hosts on a circle, this host in the middle; a line per link.
  function graph(s) {
    var W = 560, H = 400, cx = W / 2, cy = H / 2, R = 150;
    var svg = el("svg:svg", { width: W, height: H, viewBox: "0 0 " + W + " " + H, id: "topology" });
    var others = s.hosts.filter(function (h) { return h !== s.host; });
    var at = dict();
    at[s.host] = [cx, cy];
    others.forEach(function (h, i) {
      var a = -Math.PI / 2 + 2 * Math.PI * i / Math.max(others.length, 1);
      at[h] = [cx + R * Math.cos(a), cy + R * Math.sin(a)];
    });
    var reach = dict();
    s.routes.forEach(function (r) {
      var m = /^link (.*)$/.exec(r.to || "");
      // A VM's MAC: not `any`, not a group address (broadcast, multicast).
      var vm = /^[0-9a-f][02468ace]:/i.test(r.dst || "");
      if (m && vm) { (reach[m[1]] = reach[m[1]] || []).push(r.dst); }
    });
    s.links.forEach(function (l) {
      need(typeof l.name === "string" && at[l.name], "a link to no host: " + l.name);
      var k = look(l), p = at[l.name];
      var g = el("svg:g", { "class": "link", "data-link": l.name, "data-path": k.path,
                            "data-security": k.sec, "data-state": l.state });
      g.appendChild(el("svg:line", { x1: cx, y1: cy, x2: p[0], y2: p[1], stroke: k.color,
                                     "stroke-width": 3, "stroke-dasharray": k.dash }));
      var t = el("svg:text", { x: cx + 0.6 * (p[0] - cx), y: cy + 0.6 * (p[1] - cy) - 4, "text-anchor": "middle",
                               fill: k.color, "class": "halo" });
      t.textContent = k.path + " \u00b7 " + k.sec + " \u00b7 " + l.state;
      g.appendChild(el("svg:title", {}, l.name + ": " + l.kind + " to " + l.remote + ", " + k.heard));
      g.appendChild(t);
      svg.appendChild(g);
    });
    var local = s.interfaces.map(function (i) { return i.name; });
    s.hosts.forEach(function (h) {
      var p = at[h], linked = h === s.host || s.links.some(function (l) { return l.name === h; });
      var g = el("svg:g", { "class": "host", "data-host": h, "data-linked": linked });
      g.appendChild(el("svg:circle", { cx: p[0], cy: p[1], r: 20, fill: linked ? "#23395d" : "#9e9e9e" }));
      g.appendChild(el("svg:text", { x: p[0], y: p[1] + 4, "text-anchor": "middle", fill: "#fff" }, h.slice(0, 6)));
      var vms = h === s.host ? local : reach[h] || [];
      var label = vms.slice(0, 3).join(", ") + (vms.length > 3 ? " +" + (vms.length - 3) : "");
      g.appendChild(el("svg:text", { x: p[0], y: p[1] + 34, "text-anchor": "middle", fill: "#444", "class": "halo" },
                       h + (label ? ": " + label : "")));
      svg.appendChild(g);
    });
    clear($("graph")).appendChild(svg);
  }

  // The matrix as a heat map: a cell per pair, darker for more bytes.
  function heatmap(m, names) {
    var box = clear($("matrix"));
    var macs = [];
    m.pairs.forEach(function (p) {
      [p.src, p.dst].forEach(function (x) { if (macs.indexOf(x) < 0) { macs.push(x); } });
    });
    if (!macs.length) { box.appendChild(el("p", {}, "no traffic counted yet")); return; }
    var C = 26, L = 170, max = 1;
    m.pairs.forEach(function (p) { max = Math.max(max, p.bytes); });
    var svg = el("svg:svg", { width: L + C * macs.length + 110, height: L + C * macs.length + 10, id: "heatmap" });
    macs.forEach(function (x, i) {
      var name = names[x] ? names[x] + " " + x : x;
      svg.appendChild(el("svg:text", { x: L - 4, y: L + C * i + 17, "text-anchor": "end" }, name));
      svg.appendChild(el("svg:text", { x: L + C * i + 17, y: L - 4,
                                       transform: "rotate(-60 " + (L + C * i + 17) + " " + (L - 4) + ")" }, name));
    });
    m.pairs.forEach(function (p) {
      var r = el("svg:rect", { x: L + C * macs.indexOf(p.dst), y: L + C * macs.indexOf(p.src), width: C - 2,
                               height: C - 2, fill: "#c62828",
                               "fill-opacity": (0.15 + 0.85 * Math.log(1 + p.bytes) / Math.log(1 + max)).toFixed(2) });
      r.appendChild(el("svg:title", {}, p.src + " \u2192 " + p.dst + ": " + bytes(p.bytes) + ", " + p.frames + " frames"));
      svg.appendChild(r);
    });
    box.appendChild(svg);
    box.appendChild(el("p", { "class": "legend" }, "rows: source, columns: destination; other pairs: " +
                       bytes(m.other.bytes) + "; " + m.pairs_seen + " pairs seen"));
  }

  // Drops by reason: the totals, and what the last minutes added (from the
  // samples this page took while open).
  function drops(d, now) {
    var totals = dict();
    Object.keys(d).forEach(function (r) { totals[r] = (d[r].user || 0) + (d[r].kernel || 0); });
    history.push({ t: now, totals: totals });
    while (history.length > 1 && history[0].t < now - WINDOW_MS) { history.shift(); }
    var since = history[0];
    var rows = Object.keys(d).filter(function (r) { return totals[r] > 0; }).map(function (r) {
      return [r, d[r].user || 0, d[r].kernel || 0, totals[r] - (since.totals[r] || 0)];
    });
    var mins = ((now - since.t) / 60000).toFixed(1);
    table($("drops"), ["reason", "user path", "kernel path", "in the last " + mins + " min"], rows);
  }

  function render(s) {
    need(s && s.version === 1, "version");
    ["hosts", "links", "interfaces", "routes", "denies"].forEach(function (k) { need(Array.isArray(s[k]), k); });
    need(s.matrix && Array.isArray(s.matrix.pairs), "matrix");
    need(s.drops && typeof s.drops === "object", "drops");
    $("host").textContent = s.host;
    $("mode").textContent = s.mode === "cluster" && s.cluster ?
      "cluster " + s.cluster.network + ", store " + s.cluster.store + ", " + s.hosts.length + " hosts" :
      "static configuration";
    $("updated").textContent = "updated " + new Date(s.time_ms).toLocaleTimeString();
    graph(s);
    table($("links"), ["link", "kind", "remote", "state", "path", "security", "last heard", "keepalives in",
                       "tx", "rx", "downs", "data path"],
      s.links.map(function (l) {
        var k = look(l);
        return [l.name, l.kind, l.remote, l.state, k.path, k.sec + (l.cipher ? " (" + l.cipher + ")" : ""),
                k.heard, l.keepalives_received, bytes(l.tx_bytes), bytes(l.rx_bytes), l.downs, l.datapath || "user"];
      }));
    var names = dict();
    names["ff:ff:ff:ff:ff:ff"] = "broadcast";
    s.interfaces.forEach(function (i) { names[i.mac] = i.name; });
    table($("interfaces"), ["name", "kind", "mac", "addresses", "data path", "state", "tx", "rx"],
      s.interfaces.map(function (i) {
        return [i.name, i.kind, i.mac, (i.addresses || []).join(" "), i.datapath, i.state,
                bytes(i.tx_bytes), bytes(i.rx_bytes)];
      }));
    heatmap(s.matrix, names);
    drops(s.drops, s.time_ms);
    table($("denies"), ["network", "rule", "action", "denied"],
      s.denies.map(function (d) { return [String(d.network), d.rule, d.action, d.drops]; }));
    marker("ok", "drawn " + new Date().toLocaleTimeString());
  }

  function load() {
    fetch("/api/state.json", { cache: "no-store" })
      .then(function (r) { if (!r.ok) { throw new Error("GET /api/state.json: HTTP " + r.status); } return r.json(); })
      .then(render)
      .catch(function (e) { failed(e && e.message ? e.message : String(e)); });
  }
  load();
  setInterval(load, PERIOD_MS);
})();
