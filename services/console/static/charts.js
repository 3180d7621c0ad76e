// A GPU's history: one uPlot chart per metric, loaded once, then extended by the live stream's points.
(function () {
  var box = document.getElementById("charts");
  if (!box || !window.uPlot) return;
  var specs = [["util", "Utilization (%)", "#0a58ca"], ["temp", "Temperature (°C)", "#cf222e"],
               ["power", "Power (W)", "#9a6700"], ["mem_gib", "Memory used (GiB)", "#1a7f37"]];
  var plots = {}, cols = null, maxPoints = 0;

  function make(data) {
    cols = data;
    maxPoints = Math.max(900, data.t.length);
    box.innerHTML = "";
    specs.forEach(function (s) {
      var el = document.createElement("div");
      el.className = "chart";
      box.appendChild(el);
      plots[s[0]] = new uPlot({
        title: s[1] + (data.resolution === "1m" ? " — minute means" : ""), width: Math.max(300, box.clientWidth), height: 170,
        series: [{}, {label: s[0], stroke: s[2], width: 1.5, spanGaps: false}], scales: {x: {time: true}},
      }, [data.t, data[s[0]]], el);
    });
  }

  fetch(box.getAttribute("data-history"), {credentials: "same-origin"})
    .then(function (r) { return r.json(); })
    .then(make);

  document.body.addEventListener("htmx:sseMessage", function (ev) {
    if (!cols || cols.resolution !== "raw" || !ev.detail || ev.detail.type !== "point") return;
    var p = JSON.parse(ev.detail.data);
    if (cols.t.length && p.t <= cols.t[cols.t.length - 1]) return;
    ["t", "util", "temp", "power", "mem_gib"].forEach(function (k) {
      cols[k].push(p[k]);
      if (cols[k].length > maxPoints) cols[k].shift();
    });
    specs.forEach(function (s) { plots[s[0]].setData([cols.t, cols[s[0]]]); });
  });
  window.addEventListener("resize", function () {
    specs.forEach(function (s) { if (plots[s[0]]) plots[s[0]].setSize({width: Math.max(300, box.clientWidth), height: 170}); });
  });
})();
