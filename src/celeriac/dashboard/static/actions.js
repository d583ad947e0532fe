// celeriac dashboard, the actions: revoke / terminate a task, pool +1 / -1, shut a worker
// down, set a rate limit (and dead.js's requeue and purge, through window.celeriacPost).
// Each is a same-origin JSON POST carrying the CSRF token from the
// celeriac_csrf cookie (see dashboard/actions.py); the replies show in #action-status.
"use strict";
(() => {
  const $ = (id) => document.getElementById(id);
  const COOKIE = "celeriac_csrf";
  const STATUS_MS = 10000;       // how long a result stays on screen
  let statusTimer = null;

  function cookieToken() {
    for (const part of document.cookie.split(";")) {
      const [k, ...v] = part.trim().split("=");
      if (k === COOKIE) return decodeURIComponent(v.join("="));
    }
    return "";
  }
  // Sets the cookie again too (a restarted dashboard, or another one on this host, may
  // have replaced it: cookies are per host, not per port).
  async function freshToken() {
    const r = await fetch("api/csrf", { headers: { Accept: "application/json" }, cache: "no-store" });
    if (!r.ok) throw new Error("api/csrf: HTTP " + r.status);
    return (await r.json()).token;
  }

  function showStatus(message, ok) {
    const s = $("action-status");
    s.textContent = message;
    s.dataset.ok = ok ? "true" : "false";
    s.className = "action-status " + (ok ? "action-ok" : "action-err");
    s.hidden = false;
    clearTimeout(statusTimer);
    statusTimer = setTimeout(() => { s.hidden = true; }, STATUS_MS);
  }
  function describe(data) {
    if (data.error) return data.error;
    return Object.entries(data.replies || {}).map(([host, r]) => {
      const said = r && typeof r === "object" ? (r.ok ?? r.error ?? JSON.stringify(r)) : r;
      return host + ": " + (typeof said === "string" ? said : JSON.stringify(said));
    }).join("; ");
  }

  async function post(action, body) {
    const send = (token) => fetch("api/actions/" + action, {
      method: "POST",
      credentials: "same-origin",
      cache: "no-store",
      headers: { "Content-Type": "application/json", Accept: "application/json",
        "X-CSRF-Token": token },
      body: JSON.stringify(body),
    });
    let r = await send(cookieToken() || await freshToken());
    if (r.status === 403) {
      const first = await r.clone().json().catch(() => ({}));
      if (/CSRF|csrf/.test(first.error || "")) r = await send(await freshToken());
    }
    return { status: r.status, data: await r.json().catch(() => ({ error: "HTTP " + r.status })) };
  }
  window.celeriacPost = post; // dead.js's requeue and purge go through it too
  async function act(action, label, body) {
    showStatus(label + "…", true);
    try {
      const { status, data } = await post(action, body);
      const ok = status === 200 && data.ok !== false;
      showStatus(label + ": " + describe(data), ok);
    } catch (err) {
      showStatus(label + ": " + err.message, false);
    }
  }

  // Keeps the form's choices in step with what the page knows (its filters' options).
  function copyOptions(from, to, keepFirst) {
    const values = Array.from(from.options, (o) => o.value).filter((v) => v);
    const have = Array.from(to.options, (o) => o.value).slice(keepFirst ? 1 : 0);
    if (have.length === values.length && have.every((v, i) => v === values[i])) return;
    const current = to.value;
    const first = keepFirst ? [to.options[0]] : [];
    to.replaceChildren(...first, ...values.map((v) => {
      const o = document.createElement("option");
      o.value = v;
      o.textContent = v;
      return o;
    }));
    to.value = values.includes(current) ? current : (keepFirst ? "" : current);
  }
  function refreshForm() {
    copyOptions($("f-name"), $("r-tasks"), false);
    copyOptions($("f-worker"), $("r-worker"), true);
  }

  function wire() {
    $("workers").tBodies[0].addEventListener("click", (e) => {
      const button = e.target.closest("button[data-action]");
      const tr = e.target.closest("tr[data-hostname]");
      if (!button || !tr) return;
      const worker = tr.dataset.hostname;
      const action = button.dataset.action;
      if (action === "shutdown" && !window.confirm("Shut down " + worker + "? Running tasks finish first.")) return;
      const body = action === "shutdown" ? { worker } : { worker, n: 1 };
      act(action, action.replace("_", " ") + " " + worker, body);
    });
    const taskId = () => $("detail").dataset.uuid;
    $("d-revoke").addEventListener("click", () => {
      const id = taskId();
      if (id) act("revoke", "revoke " + id, { task_id: id });
    });
    $("d-terminate").addEventListener("click", () => {
      const id = taskId();
      if (!id || !window.confirm("Terminate task " + id + "? Its process is killed.")) return;
      act("revoke", "terminate " + id, { task_id: id, terminate: true });
    });
    $("rate-form").addEventListener("submit", (e) => {
      e.preventDefault();
      const body = { task_name: $("r-task").value.trim(), rate: $("r-rate").value.trim() };
      const worker = $("r-worker").value;
      if (worker) body.worker = worker;
      act("rate_limit", "rate limit " + body.task_name + " " + body.rate, body);
    });
    $("rate-form").addEventListener("focusin", refreshForm);
    setInterval(refreshForm, 2000);
    refreshForm();
  }

  async function start() {
    let config = { actions: false };
    try {
      const r = await fetch("api/config", { headers: { Accept: "application/json" }, cache: "no-store" });
      if (r.ok) config = await r.json();
    } catch (err) {
      console.warn(err);
    }
    if (!config.actions) return; // read-only: the buttons stay hidden (CSS)
    wire();
    document.body.classList.add("actions-on");
  }
  start();
})();
