// brownout UI live updates. Pages are complete without this script; it only keeps the tier
// badges, host states and the "as of" time fresh on the overview. It writes text only
// (textContent, className from a fixed set), never HTML, so data cannot become markup.
(function () {
  "use strict";
  if (document.body.dataset.page !== "overview") return;
  var TIERS = ["t0", "t1", "t2", "t3"];
  var STATES = ["fresh", "stale", "down"];
  function clock(ms) {
    return new Date(ms).toISOString().substring(11, 19);
  }
  function reasonText(r) {
    var s = r.trigger || "";
    if (r.slo) s += " · SLO " + r.slo;
    if (r.window) s += " · " + r.window;
    if (typeof r.burn_rate === "number") s += " · burn " + r.burn_rate.toFixed(1) + "×";
    if (r.detail) s += " — " + r.detail;
    return s;
  }
  function byData(attr, value) {
    // Compare in JS rather than building a CSS selector from data.
    var all = document.querySelectorAll("[data-" + attr + "]");
    for (var i = 0; i < all.length; i++) if (all[i].dataset[attr] === value) return all[i];
    return null;
  }
  function apply(v) {
    (v.clusters || []).forEach(function (c) {
      var card = byData("cluster", c.name);
      if (!card) return;
      var t = Math.max(0, Math.min(3, c.tier | 0));
      TIERS.forEach(function (k) { card.classList.remove(k); });
      card.classList.add(TIERS[t]);
      card.querySelector("[data-live=tier]").textContent = "T" + t;
      card.querySelector("[data-live=reason]").textContent = reasonText(c.reason || {});
    });
    (v.hosts || []).forEach(function (h) {
      var row = byData("host", h.host);
      if (!row || STATES.indexOf(h.state) < 0) return;
      var cell = row.querySelector("[data-live=state] .state");
      if (!cell) return;
      cell.className = "state " + h.state;
      cell.textContent = h.state;
    });
    var g = document.querySelector("[data-live=generated]");
    if (g && v.generated_at_ms) g.textContent = clock(v.generated_at_ms);
  }
  function poll() {
    fetch("/ui/api/overview", { headers: { Accept: "application/json" } })
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (v) { if (v) apply(v); })
      .catch(function () {});
  }
  setInterval(poll, 5000);
})();
