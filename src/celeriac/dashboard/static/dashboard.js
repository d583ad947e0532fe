// celeriac dashboard: vanilla JS, no build step, no dependencies.
// Everything that came from the cluster (names, args, results, tracebacks) is written
// with textContent or DOM properties, never parsed as HTML.
"use strict";
(() => {
  const LIST_LIMIT = 200;        // rows shown, and asked of /api/tasks
  const MAX_TASKS = 2000;        // tasks kept in the browser
  const HISTORY = 300;           // seconds drawn by the charts
  const STATES = ["PENDING", "RECEIVED", "STARTED", "SUCCESS", "FAILURE", "RETRY", "REVOKED",
    "REJECTED"];                 // the filter's states, and the custom ones seen (counts)
  const WORKER_ACTIONS = [["pool_grow", "pool +1", "Add a pool process"],
    ["pool_shrink", "pool \u22121", "Stop a pool process"],
    ["shutdown", "Shut down", "Warm shutdown of this worker"]];

  const $ = (id) => document.getElementById(id);
  const tasks = new Map();       // uuid -> summary (no traceback)
  const rate = new Map();        // second -> [succeeded, failed]
  let workers = [];
  let serverTime = Date.now() / 1000;
  let skew = 0;                  // server clock - browser clock, seconds
  let selected = null;           // uuid shown in the detail pane
  let source = null;
  let renderPending = false;
  let detailTimer = null;
  const filters = { state: "", name: "", worker: "" };

  // -- helpers ---------------------------------------------------------------------------
  function el(tag, text, cls) {
    const node = document.createElement(tag);
    if (text !== undefined && text !== null) node.textContent = String(text);
    if (cls) node.className = cls;
    return node;
  }
  function fmtTime(ts) {
    if (typeof ts !== "number") return "";
    const d = new Date(ts * 1000);
    return d.toLocaleTimeString([], { hour12: false }) + "." +
      String(d.getMilliseconds()).padStart(3, "0");
  }
  function fmtDate(ts) {
    if (typeof ts !== "number") return "";
    return new Date(ts * 1000).toLocaleDateString() + " " + fmtTime(ts);
  }
  function fmtSeconds(s) {
    if (typeof s !== "number") return "";
    if (s < 0.001) return (s * 1e6).toFixed(0) + " µs";
    if (s < 1) return (s * 1000).toFixed(1) + " ms";
    if (s < 120) return s.toFixed(2) + " s";
    return (s / 60).toFixed(1) + " min";
  }
  function fmtAge(ts) {
    if (typeof ts !== "number") return "never";
    const age = Math.max(0, serverTime - ts);
    return age < 1 ? "just now" : fmtSeconds(age).replace(/\.\d+ s$/, " s") + " ago";
  }
  function text(v) {
    if (v === undefined || v === null) return "";
    return typeof v === "string" ? v : JSON.stringify(v);
  }
  async function api(path) {
    const r = await fetch(path, { headers: { Accept: "application/json" }, cache: "no-store" });
    if (!r.ok) throw new Error(path + ": HTTP " + r.status);
    return r.json();
  }
  function setSelect(select, values) {
    const current = select.value;
    const wanted = ["", ...values];
    if (current && !wanted.includes(current)) wanted.push(current);
    const have = Array.from(select.options, (o) => o.value);
    if (have.length === wanted.length && have.every((v, i) => v === wanted[i])) return;
    select.replaceChildren(...wanted.map((v) => {
      const o = el("option", v === "" ? "any" : v);
      o.value = v;
      return o;
    }));
    select.value = current;
  }
  function sortKey(t) { return t.received ?? t.sent ?? t.updated ?? 0; }
  // The server describes the meta (progress_text, progress_ratio): one rule for the
  // page, the API and `celeriac events`.
  function progressCell(t) {
    const td = el("td", null, "progress");
    if (!t.progress_text) return td;
    if (typeof t.progress_ratio === "number") {
      const bar = el("span", null, "bar");
      const pct = Math.round(t.progress_ratio * 1000) / 10;
      bar.setAttribute("role", "progressbar");
      bar.setAttribute("aria-valuenow", String(pct));
      const fill = el("span", null, "fill");
      fill.style.width = pct + "%";
      bar.append(fill);
      td.append(bar);
    }
    td.append(el("span", t.progress_text, "ptext"));
    td.title = text(t.progress);
    return td;
  }

  // -- tasks -----------------------------------------------------------------------------
  function mergeTask(t) {
    const old = tasks.get(t.uuid);
    if (old && (old.updated ?? 0) > (t.updated ?? 0)) return;
    tasks.set(t.uuid, t);
  }
  function evict() {
    if (tasks.size <= MAX_TASKS) return;
    const byAge = Array.from(tasks.values()).sort((a, b) => (a.updated ?? 0) - (b.updated ?? 0));
    for (const t of byAge.slice(0, tasks.size - MAX_TASKS)) {
      if (t.uuid !== selected) tasks.delete(t.uuid);
    }
  }
  function matches(t) {
    return (!filters.state || t.state === filters.state) &&
      (!filters.name || t.name === filters.name) &&
      (!filters.worker || t.worker === filters.worker);
  }
  async function loadTasks() {
    const q = new URLSearchParams({ limit: String(LIST_LIMIT) });
    for (const [k, v] of Object.entries(filters)) if (v) q.set(k, v);
    try {
      const data = await api("api/tasks?" + q);
      for (const t of data.tasks) mergeTask(t);
      evict();
      scheduleRender();
    } catch (err) {
      console.warn(err);
    }
  }
  function scheduleRender() {
    if (renderPending) return;
    renderPending = true;
    requestAnimationFrame(() => { renderPending = false; renderTasks(); });
  }
  function renderTasks() {
    const shown = Array.from(tasks.values()).filter(matches)
      .sort((a, b) => sortKey(b) - sortKey(a));
    const rows = shown.slice(0, LIST_LIMIT).map((t) => {
      const tr = document.createElement("tr");
      tr.dataset.uuid = t.uuid;
      tr.dataset.state = t.state || "";
      if (t.uuid === selected) tr.classList.add("selected");
      tr.append(el("td", t.state, "state state-" + (t.state || "")));
      tr.append(progressCell(t));
      const name = el("td", t.name || "?", "name");
      name.title = t.name || "";
      tr.append(name);
      const id = el("td", null, "uuid mono");
      const a = el("a", String(t.uuid).slice(0, 8));
      a.href = "#task/" + encodeURIComponent(t.uuid);
      a.title = t.uuid;
      id.append(a);
      tr.append(id);
      const args = [t.args, t.kwargs && t.kwargs !== "{}" ? t.kwargs : null]
        .filter((v) => v !== null && v !== undefined).map(text).join(" ");
      const argsCell = el("td", args, "args mono");
      argsCell.title = args;
      tr.append(argsCell);
      tr.append(el("td", t.worker || "", "worker"));
      tr.append(el("td", fmtTime(t.received ?? t.sent), "time"));
      tr.append(el("td", fmtSeconds(t.runtime), "num"));
      return tr;
    });
    $("tasks").tBodies[0].replaceChildren(...rows);
    $("tasks-empty").hidden = rows.length > 0;
    $("shown").textContent = shown.length > LIST_LIMIT
      ? `newest ${LIST_LIMIT} of ${shown.length} shown` : `${shown.length} shown`;
  }

  // -- detail ----------------------------------------------------------------------------
  async function showDetail(uuid) {
    selected = uuid;
    scheduleRender();
    if (!uuid) {
      $("detail").hidden = true;
      $("tasks-panel").classList.remove("detail-open");
      return;
    }
    let t;
    try {
      t = await api("api/tasks/" + encodeURIComponent(uuid));
    } catch (err) {
      t = { uuid, state: "", name: "(not known to this dashboard)" };
    }
    if (selected !== uuid) return;
    $("detail").hidden = false;
    $("tasks-panel").classList.add("detail-open");
    $("detail").dataset.uuid = uuid;
    $("detail").dataset.state = t.state || "";
    $("d-state").textContent = t.state || "";
    $("d-state").className = "state state-" + (t.state || "");
    $("d-name").textContent = t.name || "";
    const started = t.started, finished = t.finished;
    const fields = [
      ["uuid", t.uuid], ["worker", t.worker], ["queue", t.queue],
      ["args", t.args], ["kwargs", t.kwargs], ["result", t.result],
      ["progress", t.progress], ["progressed", fmtDate(t.progressed)],
      ["retries", t.retries], ["eta", t.eta], ["expires", t.expires],
      ["sent", fmtDate(t.sent)], ["received", fmtDate(t.received)],
      ["started", fmtDate(started)], ["finished", fmtDate(finished)],
      ["runtime", fmtSeconds(t.runtime)],
      ["wait", typeof started === "number" && typeof t.received === "number"
        ? fmtSeconds(Math.max(0, started - t.received)) : ""],
      ["retried", fmtDate(t.retried)], ["revoked", fmtDate(t.revoked)],
      ["rejected", fmtDate(t.rejected)], ["root", t.root_id], ["parent", t.parent_id],
    ];
    const dl = $("d-fields");
    dl.replaceChildren();
    for (const [k, v] of fields) {
      const s = text(v);
      if (s === "") continue;
      dl.append(el("dt", k), el("dd", s, "f-" + k));
    }
    const hasExc = Boolean(t.exception || t.traceback);
    $("d-exc-box").hidden = !hasExc;
    $("d-exception").textContent = text(t.exception);
    $("d-traceback").textContent = text(t.traceback);
  }
  function fromHash() {
    const m = /^#task\/(.+)$/.exec(location.hash);
    showDetail(m ? decodeURIComponent(m[1]) : null);
  }

  // -- workers, queues, counts -----------------------------------------------------------
  function renderWorkers() {
    const rows = workers.map((w) => {
      const tr = document.createElement("tr");
      tr.dataset.hostname = w.hostname;
      tr.append(el("td", w.hostname, "mono"));
      tr.append(el("td", w.status, "status status-" + w.status));
      tr.append(el("td", w.active ?? "", "num active"));
      tr.append(el("td", w.processed ?? "", "num processed"));
      const load = Array.isArray(w.loadavg)
        ? w.loadavg.map((x) => Number(x).toFixed(2)).join(", ") : "";
      tr.append(el("td", load, "load"));
      tr.append(el("td", fmtAge(w.last_heartbeat), "age"));
      // actions.js handles the clicks (hidden unless the server allows actions)
      const acts = el("td", null, "actions");
      for (const [action, label, title] of WORKER_ACTIONS) {
        const b = el("button", label, "act act-" + action);
        b.type = "button";
        b.dataset.action = action;
        b.title = title;
        acts.append(b);
      }
      tr.append(acts);
      return tr;
    });
    $("workers").tBodies[0].replaceChildren(...rows);
    $("workers-empty").hidden = rows.length > 0;
    $("t-workers").textContent = workers.filter((w) => w.alive).length + " / " + workers.length;
    setSelect($("f-worker"), workers.map((w) => w.hostname));
  }
  function renderQueues(queues) {
    $("queues").tBodies[0].replaceChildren(...queues.map((q) => {
      const tr = document.createElement("tr");
      tr.dataset.queue = q.name;
      tr.append(el("td", q.name, "mono"));
      const n = el("td", q.length ?? (q.error ? "error" : "…"), "num");
      if (q.error) n.title = q.error;
      tr.append(n);
      return tr;
    }));
  }
  // Beat: entries from the shared store (/api/beat), every 5 s; hidden without any.
  async function loadBeat() {
    let d;
    try { d = await api("api/beat"); } catch (e) { return; }
    const entries = d.entries || [];
    $("beat-panel").hidden = entries.length === 0;
    $("beat-leader").textContent = d.leader ? "leader: " + d.leader.beat : "no beat leads";
    $("beat").tBodies[0].replaceChildren(...entries.map((b) => {
      const tr = document.createElement("tr");
      tr.dataset.entry = b.name;
      tr.append(el("td", b.name, "mono"));
      tr.append(el("td", b.task, "mono"));
      tr.append(el("td", b.schedule));
      tr.append(el("td", b.enabled ? "yes" : "no"));
      tr.append(el("td", b.last_run ? new Date(b.last_run).toLocaleString() : "-"));
      tr.append(el("td", b.next_run ? new Date(b.next_run).toLocaleString() : "-"));
      return tr;
    }));
  }
  function renderCounts(counts) {
    const total = Object.values(counts).reduce((a, b) => a + b, 0);
    $("t-tasks").textContent = total;
    const chips = Object.entries(counts).sort().map(([state, n]) => {
      const b = el("button", `${state} ${n}`, "chip state-" + state);
      b.type = "button";
      b.dataset.state = state;
      if (filters.state === state) b.classList.add("active");
      b.addEventListener("click", () => {
        $("f-state").value = filters.state === state ? "" : state;
        onFilter();
      });
      return b;
    });
    $("counts").replaceChildren(...chips);
    // custom states (update_state) join the filter once a task is in one
    setSelect($("f-state"), [...new Set([...STATES, ...Object.keys(counts).sort()])]);
  }

  // -- charts ----------------------------------------------------------------------------
  function mergeRate(series) {
    for (const [second, ok, fail] of series) rate.set(second, [ok, fail]);
    const oldest = Math.floor(serverTime) - HISTORY;
    for (const s of rate.keys()) if (s < oldest) rate.delete(s);
  }
  function drawChart(canvas, index, color) {
    const dpr = window.devicePixelRatio || 1;
    const w = canvas.clientWidth || 600, h = canvas.clientHeight || 140;
    if (canvas.width !== Math.round(w * dpr)) canvas.width = Math.round(w * dpr);
    if (canvas.height !== Math.round(h * dpr)) canvas.height = Math.round(h * dpr);
    const ctx = canvas.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, w, h);
    // the last second is still filling up: draw up to the one before
    const end = Math.floor(serverTime) - 1;
    const values = [];
    for (let s = end - HISTORY + 1; s <= end; s++) values.push((rate.get(s) || [0, 0])[index]);
    const max = Math.max(1, ...values);
    const top = niceCeil(max);
    const pad = { l: 34, r: 6, t: 6, b: 16 };
    const pw = w - pad.l - pad.r, ph = h - pad.t - pad.b;
    const style = getComputedStyle(document.documentElement);
    const muted = style.getPropertyValue("--muted").trim() || "#888";
    const line = style.getPropertyValue("--line").trim() || "#ddd";
    ctx.strokeStyle = line;
    ctx.lineWidth = 1;
    ctx.fillStyle = muted;
    ctx.font = "11px system-ui, sans-serif";
    ctx.textAlign = "right";
    ctx.textBaseline = "middle";
    for (const frac of [0, 0.5, 1]) {
      const y = pad.t + ph - frac * ph;
      ctx.beginPath(); ctx.moveTo(pad.l, y + 0.5); ctx.lineTo(w - pad.r, y + 0.5); ctx.stroke();
      ctx.fillText(formatCount(top * frac), pad.l - 4, y);
    }
    ctx.textAlign = "left"; ctx.textBaseline = "alphabetic";
    ctx.fillText("-5 min", pad.l, h - 3);
    ctx.textAlign = "right";
    ctx.fillText("now", w - pad.r, h - 3);
    const x = (i) => pad.l + (i / (values.length - 1)) * pw;
    const y = (v) => pad.t + ph - (v / top) * ph;
    const c = style.getPropertyValue(color).trim() || "#3a3";
    ctx.beginPath();
    values.forEach((v, i) => (i ? ctx.lineTo(x(i), y(v)) : ctx.moveTo(x(i), y(v))));
    ctx.strokeStyle = c; ctx.lineWidth = 1.5; ctx.stroke();
    ctx.lineTo(x(values.length - 1), y(0)); ctx.lineTo(x(0), y(0)); ctx.closePath();
    ctx.globalAlpha = 0.15; ctx.fillStyle = c; ctx.fill(); ctx.globalAlpha = 1;
    // the current rate: mean of the last 10 complete seconds
    const recent = values.slice(-10);
    return recent.reduce((a, b) => a + b, 0) / recent.length;
  }
  function niceCeil(v) {
    const p = Math.pow(10, Math.floor(Math.log10(v)));
    for (const m of [1, 2, 5, 10]) if (v <= m * p) return m * p;
    return 10 * p;
  }
  function formatCount(v) {
    return v >= 1000 ? (v / 1000).toFixed(v >= 10000 ? 0 : 1) + "k" : String(Math.round(v * 10) / 10);
  }
  function drawCharts() {
    const ok = drawChart($("chart-ok"), 0, "--ok");
    const fail = drawChart($("chart-fail"), 1, "--fail");
    $("c-ok-now").textContent = "(" + ok.toFixed(1) + "/s now)";
    $("c-fail-now").textContent = "(" + fail.toFixed(1) + "/s now)";
    $("t-rate").textContent = ok.toFixed(1);
  }

  // -- the live stream -------------------------------------------------------------------
  function onTick(d) {
    serverTime = d.time;
    skew = d.time - Date.now() / 1000;
    workers = d.workers;
    renderWorkers();
    renderQueues(d.queues);
    renderCounts(d.counts || {});
    setSelect($("f-name"), d.task_names || []);
    mergeRate(d.throughput || []);
    drawCharts();
    $("t-events").textContent = d.events;
    setConn(d.connected ? "live" : "broker?");
  }
  function onTasks(d) {
    for (const t of d.tasks) mergeTask(t);
    evict();
    scheduleRender();
    if (d.skipped) loadTasks(); // more changed than one message carries: ask for the list
    if (selected && d.tasks.some((t) => t.uuid === selected)) {
      clearTimeout(detailTimer);
      detailTimer = setTimeout(() => showDetail(selected), 150);
    }
  }
  function setConn(state) {
    const c = $("conn");
    c.textContent = state === "live" ? "live" : state === "broker?"
      ? "no broker subscription" : "reconnecting…";
    c.className = "conn " + (state === "live" ? "conn-live" : "conn-wait");
  }
  function connect() {
    source = new EventSource("api/events");
    source.addEventListener("tick", (e) => onTick(JSON.parse(e.data)));
    source.addEventListener("tasks", (e) => onTasks(JSON.parse(e.data)));
    // (re)connected: updates flow from now on, so load what happened before
    source.addEventListener("open", () => { setConn("live"); loadTasks(); });
    source.addEventListener("error", () => setConn("reconnecting"));
  }
  async function loadHistory() {
    try {
      const s = await api("api/stats");
      mergeRate(s.throughput || []);
      drawCharts();
    } catch (err) {
      console.warn(err);
    }
  }

  // -- filters ---------------------------------------------------------------------------
  function onFilter() {
    filters.state = $("f-state").value;
    filters.name = $("f-name").value;
    filters.worker = $("f-worker").value;
    for (const chip of $("counts").children) {
      chip.classList.toggle("active", chip.dataset.state === filters.state);
    }
    scheduleRender();
    loadTasks();
  }

  function start() {
    for (const id of ["f-state", "f-name", "f-worker"]) $(id).addEventListener("change", onFilter);
    $("f-clear").addEventListener("click", () => {
      for (const id of ["f-state", "f-name", "f-worker"]) $(id).value = "";
      onFilter();
    });
    $("tasks").tBodies[0].addEventListener("click", (e) => {
      const tr = e.target.closest("tr[data-uuid]");
      if (!tr || e.target.closest("a")) return;
      location.hash = "#task/" + encodeURIComponent(tr.dataset.uuid);
    });
    $("d-close").addEventListener("click", () => {
      history.replaceState(null, "", location.pathname + location.search);
      showDetail(null);
    });
    window.addEventListener("hashchange", fromHash);
    window.addEventListener("resize", drawCharts);
    // heartbeat ages and the charts' time axis move even when nothing arrives
    setInterval(() => { serverTime = Date.now() / 1000 + skew; renderWorkers(); }, 1000);
    connect();
    loadHistory();
    loadBeat();
    setInterval(loadBeat, 5000);
    fromHash();
  }
  start();
})();
