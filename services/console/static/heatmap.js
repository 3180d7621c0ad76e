// The fleet heat map: one square per GPU, a block per node, drawn on a canvas so that 8,000 GPUs
// cost one canvas, not 8,000 DOM nodes. Two texts (services/console/heatmap.py):
//   #heat-data  the layout, JSON {v, gpus, nodes: [[name, state, GPUs], ...]}: sent again only when it changes;
//   #heat-cells the cells, "<v>:<base64>", 3 bytes a GPU (utilization %, temperature % of slowdown, flag bits).
// Updates come straight from the page's event stream ("heat-layout", "heat"), not through the DOM: a cells
// update is decoded into bytes and only the squares that changed are painted again.
(function () {
  var canvas = document.getElementById("heatmap");
  var layoutEl = document.getElementById("heat-data");
  var cellsEl = document.getElementById("heat-cells");
  var metric = document.getElementById("heat-metric");
  var tip = document.getElementById("heat-tip");
  if (!canvas || !layoutEl) return;
  var STALE = 1, HOT = 2, ERROR = 8, BUSY = 16, GREY = "#8c959f", RED = "#cf222e";
  var PALETTE = [];  // 0..100 -> light to dark blue
  for (var p = 0; p <= 100; p++) {
    var t = p / 100;
    PALETTE.push("rgb(" + Math.round(219 - t * 211) + "," + Math.round(233 - t * 185) + "," + Math.round(246 - t * 139) + ")");
  }
  var layout = {v: 0, gpus: 0, nodes: []};
  var cells = new Uint8Array(0), shown = null;  // the cells now, and those painted (null: paint everything)
  var boxes = [], size = 5, gap = 1, width = 0, ratio = 1, ctx = null;

  function readLayout(text) {
    try { layout = JSON.parse(text || "{}"); } catch (e) { return; }
    layout.nodes = layout.nodes || [];
    place();
  }

  function readCells(text) {  // false: not for the layout shown (its layout comes first)
    var at = (text || "").indexOf(":");
    if (at < 0 || Number(text.slice(0, at)) !== layout.v) return false;
    var bin = atob(text.slice(at + 1)), next = new Uint8Array(bin.length);
    for (var i = 0; i < bin.length; i++) next[i] = bin.charCodeAt(i);
    cells = next;
    return true;
  }

  function place() {  // where each node's block goes; sizes the canvas (which clears it)
    width = canvas.clientWidth || 800;
    var gpus = layout.gpus || 1;
    // Squares shrink with the fleet: about 24 px for a demo fleet, 5 px at 8,000 GPUs.
    size = Math.max(5, Math.min(24, Math.floor(Math.sqrt(width * 420 / gpus))));
    gap = size > 10 ? 2 : 1;
    var pad = size > 10 ? 8 : 3, x = 0, y = 0, rowH = 0, first = 0;
    boxes = [];
    layout.nodes.forEach(function (n, k) {
      var count = n[2], perRow = Math.min(count, 8) || 1;
      var bw = perRow * (size + gap) + pad, bh = Math.ceil(count / perRow) * (size + gap) + pad;
      if (x + bw > width && x > 0) { x = 0; y += rowH; rowH = 0; }
      boxes.push({x: x, y: y, node: k, first: first, count: count, perRow: perRow});
      first += count; x += bw; rowH = Math.max(rowH, bh);
    });
    ratio = window.devicePixelRatio || 1;
    var height = y + rowH + 2;
    canvas.width = width * ratio; canvas.height = height * ratio; canvas.style.height = height + "px";
    ctx = canvas.getContext("2d");
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    shown = null;
    canvas.setAttribute("aria-label", (layout.gpus || 0) + " GPUs on " + layout.nodes.length + " nodes");
  }

  function colourOf(j) {
    var bits = cells[j + 2];
    if (bits & STALE) return GREY;
    if (bits & (ERROR | HOT)) return RED;
    var v = metric && metric.value === "temp" ? (cells[j + 1] - 30) * 100 / 70 : cells[j];
    return PALETTE[Math.max(0, Math.min(100, Math.round(v)))];
  }

  function paint() {  // the squares whose cell changed since the last paint, grouped by colour
    if (!ctx) return;
    var all = shown === null || shown.length !== cells.length, groups = {};
    if (all) {
      ctx.clearRect(0, 0, width, canvas.height / ratio);
      ctx.strokeStyle = "#bf8700"; ctx.lineWidth = 2;
      boxes.forEach(function (b) {
        var state = layout.nodes[b.node][1];
        if (state === "draining" || state === "lost" || state === "suspect") {
          ctx.strokeRect(b.x + 0.5, b.y + 0.5, b.perRow * (size + gap) + 1, Math.ceil(b.count / b.perRow) * (size + gap) + 1);
        }
      });
    }
    boxes.forEach(function (b) {
      for (var i = 0; i < b.count; i++) {
        var j = (b.first + i) * 3;
        if (j + 2 >= cells.length) return;
        if (!all && shown[j] === cells[j] && shown[j + 1] === cells[j + 1] && shown[j + 2] === cells[j + 2]) continue;
        var c = colourOf(j);
        (groups[c] = groups[c] || []).push(b.x + 2 + (i % b.perRow) * (size + gap), b.y + 2 + Math.floor(i / b.perRow) * (size + gap));
      }
    });
    for (var c in groups) {
      ctx.fillStyle = c;
      var xy = groups[c];
      for (var k = 0; k < xy.length; k += 2) ctx.fillRect(xy[k], xy[k + 1], size, size);
    }
    shown = cells;
  }

  function at(ev) {  // [node name, GPU index, cell offset, node state] under the pointer
    var r = canvas.getBoundingClientRect(), px = ev.clientX - r.left - 2, py = ev.clientY - r.top - 2;
    for (var k = 0; k < boxes.length; k++) {
      var b = boxes[k], col = Math.floor((px - b.x) / (size + gap)), row = Math.floor((py - b.y) / (size + gap));
      if (col < 0 || row < 0 || col >= b.perRow || px - b.x - col * (size + gap) >= size || py - b.y - row * (size + gap) >= size) continue;
      var i = row * b.perRow + col;
      if (i < b.count) return [layout.nodes[b.node][0], i, (b.first + i) * 3, layout.nodes[b.node][1]];
    }
    return null;
  }

  function report(type, started, bytes) {  // for the benchmark: what each update cost in the page
    document.dispatchEvent(new CustomEvent("live:update",
      {detail: {type: type, cost: performance.now() - started, bytes: bytes}}));
  }

  canvas.addEventListener("mousemove", function (ev) {
    var l = at(ev);
    if (!l || l[2] + 2 >= cells.length) { tip.hidden = true; return; }
    var j = l[2], bits = cells[j + 2];
    tip.textContent = l[0] + " GPU " + l[1] + ": " + cells[j] + "% util, " + cells[j + 1] + "% of slowdown temp" +
      ((bits & BUSY) ? ", running a job" : "") + ((bits & STALE) ? ", stale" : "") + ((bits & ERROR) ? ", errors" : "") +
      (l[3] !== "healthy" ? " (node " + l[3] + ")" : "");
    tip.style.left = (ev.clientX + 12) + "px"; tip.style.top = (ev.clientY + 12) + "px"; tip.hidden = false;
  });
  canvas.addEventListener("mouseleave", function () { tip.hidden = true; });
  canvas.addEventListener("click", function (ev) {
    var l = at(ev);
    if (l) window.location.href = "/fleet/nodes/" + encodeURIComponent(l[0]);
  });
  if (metric) metric.addEventListener("change", function () { shown = null; paint(); });
  window.addEventListener("resize", function () {
    if ((canvas.clientWidth || 800) !== width) { place(); paint(); }
  });
  // htmx's SSE extension opens the stream (again after a reconnect) and says so with its EventSource.
  document.body.addEventListener("htmx:sseOpen", function (ev) {
    var source = ev.detail && ev.detail.source;
    if (!source || source.__heatmap) return;
    source.__heatmap = true;
    source.addEventListener("heat-layout", function (e) {
      var started = performance.now();
      layoutEl.textContent = e.data;
      readLayout(e.data);
      report("heat-layout", started, e.data.length);
    });
    source.addEventListener("heat", function (e) {
      var started = performance.now();
      if (readCells(e.data)) paint();
      report("heat", started, e.data.length);
    });
  });
  readLayout(layoutEl.textContent);
  if (cellsEl && readCells(cellsEl.textContent)) {
    paint();
    // The frame that shows the first drawing starts now: the page's own "heat map drawn" time (the benchmark).
    requestAnimationFrame(function () { performance.mark("heatmap:drawn"); });
  }
})();
