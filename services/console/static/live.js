// Live fragments patched in place: an element with data-live="<event>" inside an htmx sse-connect takes that
// event's HTML from the page's stream and changes only what differs (text, attributes, the rows that came or
// went), instead of replacing the whole fragment: at 100 node rows a second that is a few text writes, not
// thousands of new elements for the browser to lay out, and a link that has the keyboard's focus keeps it.
// The fragments it patches carry no hx-* attributes (htmx would not see new ones).
(function () {
  function syncAttributes(old, neu) {
    var i, a;
    for (i = 0; i < neu.attributes.length; i++) {
      a = neu.attributes[i];
      if (old.getAttribute(a.name) !== a.value) old.setAttribute(a.name, a.value);
    }
    for (i = old.attributes.length - 1; i >= 0; i--) {
      a = old.attributes[i];
      if (!neu.hasAttribute(a.name)) old.removeAttribute(a.name);
    }
  }

  function morphChildren(old, neu) {
    var a = old.firstChild, b = neu.firstChild;
    while (a || b) {
      if (!b) { var gone = a; a = a.nextSibling; old.removeChild(gone); continue; }
      var nextB = b.nextSibling;
      if (!a) {
        old.appendChild(b);
      } else if (a.nodeType !== b.nodeType || a.nodeName !== b.nodeName) {
        var nextA = a.nextSibling;
        old.replaceChild(b, a);
        a = nextA;
      } else {
        if (a.nodeType === 1) { syncAttributes(a, b); morphChildren(a, b); }
        else if (a.nodeValue !== b.nodeValue) a.nodeValue = b.nodeValue;
        a = a.nextSibling;
      }
      b = nextB;
    }
  }

  function patch(target, html) {
    var started = performance.now(), t = document.createElement("template");
    t.innerHTML = html;
    morphChildren(target, t.content);
    document.dispatchEvent(new CustomEvent("live:update",
      {detail: {type: target.getAttribute("data-live"), cost: performance.now() - started, bytes: html.length}}));
  }

  document.body.addEventListener("htmx:sseOpen", function (ev) {
    var source = ev.detail && ev.detail.source, root = ev.target;
    if (!source || !root || !root.querySelectorAll) return;
    root.querySelectorAll("[data-live]").forEach(function (target) {
      var name = target.getAttribute("data-live");
      source.__live = source.__live || {};
      if (source.__live[name]) return;
      source.__live[name] = true;
      source.addEventListener(name, function (e) { patch(target, e.data); });
    });
  });
})();
