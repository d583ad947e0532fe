// celeriac dashboard, the dead letters (dashboard/dead.py): the list (refreshed every few
// seconds), one inspected whole, requeue (one, or all) and purge (one, or all: asks first,
// naming how many). Requeue and purge are actions: hidden when the dashboard is read-only,
// sent through actions.js's CSRF-protected POST (window.celeriacPost).
// A broker that cannot give its dead letters is said so in #dead-error, the list and its
// buttons hidden. Everything from the broker is written with textContent, never parsed
// as HTML.
"use strict";
(() => {
  const $ = (id) => document.getElementById(id);
  const REFRESH_MS = 3000;
  let letters = [];

  function el(tag, text, cls) {
    const node = document.createElement(tag);
    if (text !== undefined && text !== null) node.textContent = String(text);
    if (cls) node.className = cls;
    return node;
  }
  function when(ts) {
    return typeof ts === "number" ? new Date(ts * 1000).toLocaleString([], { hour12: false }) : "";
  }
  function status(message, ok) {
    const s = $("action-status");
    s.textContent = message;
    s.dataset.ok = ok ? "true" : "false";
    s.className = "action-status " + (ok ? "action-ok" : "action-err");
    s.hidden = false;
  }

  async function refresh() {
    try {
      const r = await fetch("api/dead?limit=200", { headers: { Accept: "application/json" }, cache: "no-store" });
      const data = await r.json().catch(() => ({ error: "HTTP " + r.status }));
      if (!r.ok) {
        // Said in place of the list: an empty list would say there are none.
        letters = [];
        render(0, data.error || "HTTP " + r.status);
        return;
      }
      letters = data.dead;
      render(data.total, null);
    } catch (err) {
      console.warn(err);
    }
  }
  function render(total, error) {
    const panel = $("dead-panel");
    if (error) panel.dataset.unreadable = "true";
    else delete panel.dataset.unreadable;
    $("dead-error").textContent = error ? "Cannot show the dead letters: " + error : "";
    $("dead-error").hidden = !error;
    const body = $("dead").tBodies[0];
    body.replaceChildren(...letters.map((d) => {
      const tr = el("tr");
      tr.dataset.id = d.id;
      for (const [value, cls] of [[d.id, "id"], [when(d.dead_at), "when"], [d.queue, "queue"],
        [d.task, "task"], [d.task_id, "task-id"], [d.deliveries, "num"], [d.reason, "reason"]]) {
        tr.append(el("td", value, cls));
      }
      const buttons = el("td", null, "dead-buttons");
      const inspect = el("button", "Inspect", "inspect");
      inspect.dataset.do = "inspect";
      const requeue = el("button", "Requeue", "requeue actions");
      requeue.dataset.do = "requeue";
      const purge = el("button", "Purge", "purge actions");
      purge.dataset.do = "purge";
      buttons.append(inspect, requeue, purge);
      tr.append(buttons);
      return tr;
    }));
    $("dead-empty").hidden = letters.length > 0 || !!error;
    $("dead-total").textContent = total ? "(" + total + ")" : "";
  }

  async function inspect(id) {
    const r = await fetch("api/dead/" + encodeURIComponent(id), { headers: { Accept: "application/json" }, cache: "no-store" });
    const data = await r.json().catch(() => ({ error: "HTTP " + r.status }));
    $("dd-id").textContent = id;
    $("dd-json").textContent = JSON.stringify(data, null, 2);
    $("dead-detail").hidden = false;
    $("dead-detail").dataset.id = id;
  }

  async function act(action, label, body) {
    status(label + "…", true);
    try {
      const { status: code, data } = await window.celeriacPost(action, body);
      const ok = code === 200 && data.ok !== false;
      status(label + ": " + (ok ? data.count + " message(s)" : (data.error || "HTTP " + code)), ok);
    } catch (err) {
      status(label + ": " + err.message, false);
    }
    await refresh();
  }
  function purge(ids) {
    const count = ids ? ids.length : letters.length;
    const what = ids ? "dead letter " + ids.join(", ") : "all " + count + " dead letter(s)";
    if (!window.confirm("Delete " + what + " for good? This cannot be undone.")) return;
    act("dead_purge", "purge " + what, ids ? { ids, confirm: true } : { all: true, confirm: true });
  }

  function wire() {
    $("dead").tBodies[0].addEventListener("click", (e) => {
      const button = e.target.closest("button[data-do]");
      const tr = e.target.closest("tr[data-id]");
      if (!button || !tr) return;
      const id = tr.dataset.id;
      if (button.dataset.do === "inspect") inspect(id);
      else if (button.dataset.do === "requeue") act("dead_requeue", "requeue " + id, { ids: [id] });
      else purge([id]);
    });
    $("dead-requeue-all").addEventListener("click", () => act("dead_requeue", "requeue all", { all: true }));
    $("dead-purge-all").addEventListener("click", () => purge(null));
    $("dd-close").addEventListener("click", () => { $("dead-detail").hidden = true; });
    refresh();
    setInterval(refresh, REFRESH_MS);
  }
  wire();
})();
