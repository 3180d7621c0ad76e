// The fleet heat map: one square per GPU, a block per node, drawn on a canvas so that 8,000 GPUs
// cost one draw, not 8,000 DOM nodes. Data: #heat-data (JSON), replaced by the live stream each second.
(function () {
  var canvas = document.getElementById("heatmap");
  var source = document.getElementById("heat-data");
  var metric = document.getElementById("heat-metric");
  var tip = document.getElementById("heat-tip");
  if (!canvas || !source) return;
  var STALE = 1, HOT = 2, ERROR = 8;
  var layout = [];  // [x, y, size, node, gpuIndex, cell]

  function colour(v) {  // 0..100 -> light to dark blue
    var t = Math.max(0, Math.min(1, v / 100));
    var r = Math.round(219 - t * 211), g = Math.round(233 - t * 185), b = Math.round(246 - t * 139);
    return "rgb(" + r + "," + g + "," + b + ")";
  }

  function draw() {
    var data;
    try { data = JSON.parse(source.textContent || "{}"); } catch (e) { return; }
    var nodes = data.nodes || [];
    var width = canvas.clientWidth || 800;
    var gpus = data.gpus || 1;
    // Squares shrink with the fleet: about 24 px for a demo fleet, 5 px at 8,000 GPUs.
    var size = Math.max(5, Math.min(24, Math.floor(Math.sqrt(width * 420 / gpus))));
    var gap = size > 10 ? 2 : 1, pad = size > 10 ? 8 : 3;
    var x = 0, y = 0, rowH = 0, items = [];
    nodes.forEach(function (n) {
      var cells = n[2], perRow = Math.min(cells.length, 8);
      var bw = perRow * (size + gap) + pad, bh = Math.ceil(cells.length / perRow) * (size + gap) + pad;
      if (x + bw > width && x > 0) { x = 0; y += rowH; rowH = 0; }
      items.push([x, y, n, perRow]);
      x += bw; rowH = Math.max(rowH, bh);
    });
    var ratio = window.devicePixelRatio || 1, height = y + rowH + 2;
    canvas.width = width * ratio; canvas.height = height * ratio; canvas.style.height = height + "px";
    var ctx = canvas.getContext("2d");
    ctx.scale(ratio, ratio);
    ctx.clearRect(0, 0, width, height);
    layout = [];
    var byTemp = metric && metric.value === "temp";
    items.forEach(function (it) {
      var n = it[2], cells = n[2], perRow = it[3];
      if (n[1] === "draining" || n[1] === "lost" || n[1] === "suspect") {
        ctx.strokeStyle = "#bf8700"; ctx.lineWidth = 2;
        ctx.strokeRect(it[0] + 0.5, it[1] + 0.5, perRow * (size + gap) + 1, Math.ceil(cells.length / perRow) * (size + gap) + 1);
      }
      cells.forEach(function (c, i) {
        var cx = it[0] + 2 + (i % perRow) * (size + gap), cy = it[1] + 2 + Math.floor(i / perRow) * (size + gap);
        var value = byTemp ? Math.max(0, (c[1] - 30) * 100 / 70) : c[0];
        ctx.fillStyle = (c[2] & STALE) ? "#8c959f" : (c[2] & (ERROR | HOT)) ? "#cf222e" : colour(value);
        ctx.fillRect(cx, cy, size, size);
        layout.push([cx, cy, size, n[0], i, c, n[1]]);
      });
    });
    canvas.setAttribute("aria-label", gpus + " GPUs on " + nodes.length + " nodes");
  }

  function at(ev) {
    var r = canvas.getBoundingClientRect(), px = ev.clientX - r.left, py = ev.clientY - r.top;
    for (var i = 0; i < layout.length; i++) {
      var l = layout[i];
      if (px >= l[0] && px < l[0] + l[2] && py >= l[1] && py < l[1] + l[2]) return l;
    }
    return null;
  }

  canvas.addEventListener("mousemove", function (ev) {
    var l = at(ev);
    if (!l) { tip.hidden = true; return; }
    var c = l[5];
    tip.textContent = l[3] + " GPU " + l[4] + ": " + c[0] + "% util, " + c[1] + "% of slowdown temp" +
      ((c[2] & 16) ? ", running a job" : "") + ((c[2] & STALE) ? ", stale" : "") + ((c[2] & ERROR) ? ", errors" : "") +
      (l[6] !== "healthy" ? " (node " + l[6] + ")" : "");
    tip.style.left = (ev.clientX + 12) + "px"; tip.style.top = (ev.clientY + 12) + "px"; tip.hidden = false;
  });
  canvas.addEventListener("mouseleave", function () { tip.hidden = true; });
  canvas.addEventListener("click", function (ev) {
    var l = at(ev);
    if (l) window.location.href = "/fleet/nodes/" + encodeURIComponent(l[3]);
  });
  if (metric) metric.addEventListener("change", draw);
  window.addEventListener("resize", draw);
  document.body.addEventListener("htmx:sseMessage", function (ev) {
    if (ev.detail && ev.detail.type === "heat") draw();
  });
  draw();
})();
