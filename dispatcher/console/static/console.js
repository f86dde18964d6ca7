// The Sluice console: draws the page the path names from the JSON API (/api/v1/...). Every value from the
// API goes into the page as text (textContent), never as markup.
"use strict";

const TOKEN_KEY = "sluice.token";
const POLL_MS = 2000;
const FINAL = new Set(["SUCCEEDED", "FAILED", "CANCELLED"]);
const STATES = ["WAITING", "QUEUED", "DISPATCHED", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED"];
const SVG = "http://www.w3.org/2000/svg";

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") node.className = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function svg(tag, attrs, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, String(value));
  if (text !== undefined) node.textContent = String(text);
  return node;
}

function show(...nodes) {
  const main = document.getElementById("main");
  main.replaceChildren(...nodes.flat(Infinity));
}

function table(headers, rows) {
  return el("table", {}, el("thead", {}, el("tr", {}, headers.map((h) =>
    el("th", { class: h.startsWith("#") ? "num" : null }, h.replace(/^#/, ""))))), el("tbody", {}, rows));
}

function td(value, cls) { return el("td", { class: cls }, value === null || value === undefined ? "" : value); }
function stateCell(state) { return el("td", {}, el("span", { class: `state state-${state}` }, state)); }
function when(text) { return text ? text.replace("T", " ").replace(/\.\d+Z$/, "Z") : ""; }
function money(value, currency) { return `${Number(value || 0).toFixed(2)}${currency ? " " + currency : ""}`; }

// A Kubernetes quantity ("500m", "16Gi", "2") as a number, for drawing bars.
const SUFFIXES = { m: 1e-3, k: 1e3, M: 1e6, G: 1e9, T: 1e12, P: 1e15, E: 1e18, Ki: 1024, Mi: 1024 ** 2,
  Gi: 1024 ** 3, Ti: 1024 ** 4, Pi: 1024 ** 5, Ei: 1024 ** 6 };
function quantity(text) {
  if (text === undefined || text === null || text === "") return 0;
  const match = /^([+-]?[0-9.]+(?:[eE][+-]?\d+)?)([a-zA-Z]*)$/.exec(String(text));
  if (!match) return 0;
  return Number(match[1]) * (SUFFIXES[match[2]] || 1);
}

class Unauthenticated extends Error {}

async function api(path, options) {
  const token = sessionStorage.getItem(TOKEN_KEY) || "";
  const response = await fetch(path, { ...(options || {}), headers: { Authorization: `Bearer ${token}` },
    cache: "no-store" });
  let body = null;
  try { body = await response.json(); } catch (_) { body = null; }
  if (response.status === 401) {
    toLogin();
    throw new Unauthenticated((body && body.error) || "not logged in");
  }
  if (!response.ok) throw new Error((body && body.error) || `${response.status} ${response.statusText}`);
  return body;
}

function toLogin() {
  sessionStorage.removeItem(TOKEN_KEY);
  const here = location.pathname + location.search;
  location.assign(`/login?next=${encodeURIComponent(here)}`);
}

function errorBox(error) { return el("p", { class: "error", role: "alert" }, error.message || String(error)); }

// Runs draw() now and every POLL_MS while the page is shown; an error shows in `status` and polling goes on.
function poll(draw, status) {
  let busy = false;
  const tick = async () => {
    if (busy || document.hidden) return;
    busy = true;
    try { await draw(); status.replaceChildren(); } catch (error) {
      if (!(error instanceof Unauthenticated)) status.replaceChildren(errorBox(error));
    } finally { busy = false; }
  };
  tick();
  return setInterval(tick, POLL_MS);
}

// ---- login
function loginPage() {
  const next = new URLSearchParams(location.search).get("next") || "/";
  const status = el("div");
  const token = el("textarea", { id: "token", name: "token", autocomplete: "off", spellcheck: "false",
    placeholder: "sl_..." });
  const form = el("form", { class: "login", id: "login-form" },
    el("h1", {}, "Log in to Sluice"),
    el("p", { class: "muted" }, "Paste a Sluice token (sluice up writes the admin one to its data directory; " +
      "`sluice admin token create` makes others). It is kept in this tab only and sent with each request."),
    token, el("p", {}, el("button", { class: "action", type: "submit", id: "login" }, "Log in")), status);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, token.value.trim());
    const response = await fetch("/api/v1/queues", { headers: { Authorization: `Bearer ${token.value.trim()}` } });
    if (response.ok) {
      location.assign(next.startsWith("/") && !next.startsWith("//") ? next : "/");
      return;
    }
    sessionStorage.removeItem(TOKEN_KEY);
    let message = `${response.status} ${response.statusText}`;
    try { message = (await response.json()).error || message; } catch (_) { /* the status says it */ }
    status.replaceChildren(errorBox(new Error(message)));
  });
  document.getElementById("nav").hidden = true;
  show(form);
  token.focus();
}

// ---- jobs
function jobsPage() {
  const params = new URLSearchParams(location.search);
  const field = (name, label, input) => el("label", {}, label, input);
  const text = (name) => el("input", { name, id: `filter-${name}`, value: params.get(name) || "", size: 14 });
  const state = el("select", { name: "state", id: "filter-state" }, el("option", { value: "" }, "any"),
    STATES.map((s) => el("option", { value: s, selected: params.get("state") === s }, s)));
  const form = el("form", { class: "filters", id: "filters" },
    field("queue", "Queue", text("queue")), field("state", "State", state), field("user", "User", text("user")),
    field("cluster", "Cluster", text("cluster")), field("name", "Name contains", text("name")),
    el("button", { class: "action", type: "submit", id: "apply" }, "Filter"));
  const pages = [""];  // page tokens of the pages so far: the last is the one shown
  let nextToken = null;
  const body = el("tbody", { id: "jobs-body" });
  const where = el("span", { class: "muted" });
  const prev = el("button", { type: "button", id: "prev" }, "← Previous");
  const next = el("button", { type: "button", id: "next" }, "Next →");
  const status = el("div");
  const limit = 50;

  const draw = async () => {
    const query = new URLSearchParams();
    for (const name of ["queue", "state", "user", "cluster", "name"]) if (params.get(name)) query.set(name, params.get(name));
    query.set("limit", String(limit));
    if (pages[pages.length - 1]) query.set("page", pages[pages.length - 1]);
    const reply = await api(`/api/v1/jobs?${query}`);
    nextToken = reply.nextPageToken;
    body.replaceChildren(...reply.jobs.map((job) => el("tr", { "data-job": job.id },
      el("td", { class: "num" }, el("a", { href: `/jobs/${job.id}` }, String(job.id))), td(job.name), td(job.queue),
      stateCell(job.state), td(job.submittedBy), td(job.cluster), td(job.attempt, "num"), td(when(job.createdAt)),
      td(job.reason))));
    if (!reply.jobs.length) body.replaceChildren(el("tr", {}, el("td", { colspan: 9, class: "muted" }, "No jobs match.")));
    where.textContent = `page ${pages.length}`;
    prev.disabled = pages.length === 1;
    next.disabled = !nextToken;
  };
  prev.addEventListener("click", () => { if (pages.length > 1) { pages.pop(); draw().catch(() => {}); } });
  next.addEventListener("click", () => { if (nextToken) { pages.push(nextToken); draw().catch(() => {}); } });
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const query = new URLSearchParams();
    for (const [key, value] of new FormData(form)) if (String(value).trim()) query.set(key, String(value).trim());
    location.assign(`/?${query}`);
  });
  show(el("h1", {}, "Jobs"), form, status,
    table(["#ID", "Name", "Queue", "State", "User", "Cluster", "#Attempt", "Created", "Reason"], []),
    el("div", { class: "pager" }, prev, where, next));
  document.querySelector("main table").replaceChild(body, document.querySelector("main table tbody"));
  poll(draw, status);
}

// ---- one job
function jobPage(jobId) {
  const status = el("div");
  const content = el("div", { id: "job" });
  // The buttons outlive each poll's redraw, so a click that lands while the page is redrawn still finds them.
  let confirming = false;
  let final = false;
  const actions = el("p", {});
  const cancel = el("button", { class: "action danger", type: "button", id: "cancel",
    onclick: () => { confirming = true; showActions(); } }, "Cancel job");
  const confirm = el("button", { class: "action danger", type: "button", id: "confirm-cancel",
    onclick: () => jobPage.cancel() }, `Really cancel job ${jobId}`);
  const keep = el("button", { type: "button", onclick: () => { confirming = false; showActions(); } }, "Keep it");
  const showActions = () => {
    const wanted = final ? [] : confirming ? [confirm, keep] : [cancel];
    if (wanted.length !== actions.children.length || wanted.some((b, i) => actions.children[i] !== b)) {
      actions.replaceChildren(...wanted.flatMap((b, i) => (i ? [" ", b] : [b])));
    }
  };
  const draw = async () => {
    const [job, why] = await Promise.all([api(`/api/v1/jobs/${encodeURIComponent(jobId)}`),
      api(`/api/v1/jobs/${encodeURIComponent(jobId)}/explain`)]);
    final = FINAL.has(job.state);
    showActions();
    content.replaceChildren(...jobView(job, why, actions));
  };
  // Logs are read from the job's cluster when the page opens and when asked, not at every poll.
  const logLines = el("pre", { id: "log-lines" }, "reading…");
  const loadLogs = async () => {
    try {
      const logs = await api(`/api/v1/jobs/${encodeURIComponent(jobId)}/logs`);
      logLines.textContent = logs.lines.length
        ? logs.lines.map((l) => `[${l.pod}] ${l.line}`).join("\n")
        : `no lines yet (attempt ${logs.attempt} on ${logs.cluster})`;
    } catch (error) { if (!(error instanceof Unauthenticated)) logLines.textContent = error.message; }
  };
  const logsBox = el("div", {}, el("h2", {}, "Logs (each pod's last 200 lines)"),
    el("p", {}, el("button", { type: "button", id: "refresh-logs", onclick: loadLogs }, "Read the logs again")),
    logLines);
  show(el("h1", {}, `Job ${jobId}`), status, content, logsBox);
  loadLogs();
  const timer = poll(draw, status);
  jobPage.cancel = async () => {
    try {
      await api(`/api/v1/jobs/${encodeURIComponent(jobId)}/cancel`, { method: "POST" });
      confirming = false;
      await draw();
    } catch (error) { if (!(error instanceof Unauthenticated)) status.replaceChildren(errorBox(error)); }
  };
  return timer;
}

// Each attempt's cluster and times, from the job's events (an attempt starts at its DISPATCHED event; the state
// it left for, other than RUNNING, ends it: back to QUEUED when it was lost or preempted).
function attempts(events) {
  const found = new Map();
  for (const e of events) {
    if (!e.attempt) continue;
    const a = found.get(e.attempt) || { attempt: e.attempt, cluster: "", dispatched: "", running: "", ended: "",
      state: "", reason: "" };
    if (e.to === "DISPATCHED") { a.dispatched = e.at; a.cluster = e.cluster || a.cluster; a.state = e.to; }
    else if (e.to === "RUNNING") { a.running = e.at; a.state = e.to; }
    else if (a.dispatched && !a.ended) { a.ended = e.at; a.state = e.to; a.reason = e.reason; }
    found.set(e.attempt, a);
  }
  return [...found.values()].filter((a) => a.dispatched);
}

function jobView(job, why, actions) {
  const fields = [["Name", job.name], ["Queue", job.queue], ["Service class", job.serviceClass],
    ["Priority", job.priority], ["Submitted by", job.submittedBy], ["Cluster", job.cluster],
    ["Attempt", `${job.attempt} (retries allowed: ${job.maxRetries})`],
    ["Queue position", job.queuePosition], ["Created", when(job.createdAt)], ["Dispatched", when(job.dispatchedAt)],
    ["Started", when(job.startedAt)], ["Finished", when(job.finishedAt)],
    ["Labels", Object.entries(job.labels || {}).map(([k, v]) => `${k}=${v}`).join(", ")]];
  const state = el("p", {}, "State: ", el("span", { class: `state state-${job.state}`, id: "job-state" }, job.state),
    job.reason ? el("span", { class: "muted", id: "job-reason" }, ` — ${job.reason}`) : null);
  const podSets = ((job.spec || {}).spec || {}).podSets || [];
  const requests = (podSet) => {
    const total = {};
    for (const c of (((podSet.template || {}).spec || {}).containers || [])) {
      for (const [name, amount] of Object.entries(((c.resources || {}).requests) || {})) {
        total[name] = total[name] ? `${total[name]} + ${amount}` : String(amount);
      }
    }
    return Object.entries(total).map(([k, v]) => `${k}: ${v}`).join(", ");
  };
  const out = [state, actions,
    el("dl", { class: "fields" }, fields.map(([k, v]) => [el("dt", {}, k), el("dd", {}, v ?? "")])),
    el("h2", {}, "Pod sets"),
    table(["Name", "#Pods", "Requests per pod"], podSets.map((p) =>
      el("tr", {}, td(p.name), td(p.count, "num"), td(requests(p))))),
    el("h2", {}, "Why it is where it is"),
    el("p", {}, "Quota: ", el("span", { id: "quota" }, why.quota || "")),
    table(["Cluster", "Verdict"], why.clusters.map((c) => el("tr", {}, td(c.cluster), td(c.verdict))))];
  if (why.bursts.length) {
    out.push(el("h2", {}, "Burst decisions"));
    for (const b of why.bursts) {
      out.push(el("dl", { class: "fields" }, [["Attempt", b.attempt], ["Policy", b.policy], ["Cluster", b.cluster],
        ["Trigger", b.trigger], ["Rate per hour", money(b.ratePerHour)], ["Expected hours", b.expectedHours],
        ["Expected cost", money(b.expectedCost)], ["Starts in", `${b.startsInSeconds} s`]]
        .map(([k, v]) => [el("dt", {}, k), el("dd", {}, v ?? "")])),
      table(["Alternative", "Verdict"], b.alternatives.map((a) => el("tr", {}, td(a.cluster), td(a.verdict)))));
    }
  }
  out.push(el("h2", {}, "Attempts"), table(["Attempt", "Cluster", "Dispatched", "Running", "Ended", "State", "Reason"],
    attempts(job.events).map((a) => el("tr", { "data-attempt": a.attempt }, td(a.attempt, "num"), td(a.cluster),
      td(when(a.dispatched)), td(when(a.running)), td(when(a.ended)), stateCell(a.state), td(a.reason)))));
  out.push(el("h2", {}, "Events"), table(["Attempt", "At", "From", "To", "Cluster", "Reason"],
    job.events.map((e) => el("tr", {}, td(e.attempt, "num"), td(when(e.at)), td(e.from), stateCell(e.to),
      td(e.cluster), td(e.reason)))));
  return out;
}

// ---- queues
function bar(used, guaranteed, max) {
  const scale = Math.max(used, guaranteed, max, 1e-9);
  const fill = el("div", { class: `fill${max && used > max ? " over" : ""}` });
  fill.style.width = `${Math.min(100, (100 * used) / scale)}%`;
  const track = el("div", { class: "track" }, fill);
  if (guaranteed) {
    const mark = el("div", { class: "mark", title: "guaranteed" });
    mark.style.left = `calc(${Math.min(100, (100 * guaranteed) / scale)}% - 1px)`;
    track.append(mark);
  }
  return track;
}

function queuesPage() {
  const status = el("div");
  const body = el("tbody", { id: "queues-body" });
  const draw = async () => {
    const { queues } = await api("/api/v1/queues");
    const children = {};
    for (const q of queues) (children[q.parent || ""] ||= []).push(q);
    const rows = [];
    const walk = (parent, depth) => {
      for (const q of (children[parent] || []).sort((a, b) => a.name.localeCompare(b.name))) {
        const names = [...new Set([...Object.keys(q.guaranteed), ...Object.keys(q.max), ...Object.keys(q.used)])].sort();
        rows.push(el("tr", { "data-queue": q.name }, el("td", { class: `indent-${Math.min(depth, 3)}` }, q.name),
          td(q.queuedJobs, "num"), td(q.runningJobs, "num"),
          td(`${(100 * (q.fairShare || 0)).toFixed(1)} % (${q.fairShareRank || "-"})`, "num"),
          el("td", {}, el("div", { class: "bars" }, names.map((r) => [el("span", {}, r),
            bar(quantity(q.used[r]), quantity(q.guaranteed[r]), quantity(q.max[r])),
            el("span", { class: "muted" }, `${q.used[r] || "0"} used · ${q.guaranteed[r] || "0"} guaranteed · ` +
              `${q.max[r] || "no"} max`)])))));
        walk(q.name, depth + 1);
      }
    };
    walk("", 0);
    const known = new Set(queues.map((q) => q.name));
    for (const q of queues) if (q.parent && !known.has(q.parent)) walk(q.parent, 0);
    body.replaceChildren(...rows);
  };
  const legend = el("p", { class: "legend" }, el("span", {}, el("i", { class: "used" }), "used (bar, to the max)"),
    el("span", {}, el("i", { class: "guaranteed" }), "guaranteed"));
  const grid = table(["Queue", "#Queued", "#Running", "Fair share (rank)", "Used · guaranteed · max"], []);
  grid.replaceChild(body, grid.querySelector("tbody"));
  show(el("h1", {}, "Queues"), legend, status, grid);
  poll(draw, status);
}

// ---- clusters
function clustersPage() {
  const status = el("div");
  const body = el("tbody", { id: "clusters-body" });
  const draw = async () => {
    const { clusters } = await api("/api/v1/clusters");
    body.replaceChildren(...clusters.map((c) => {
      const names = Object.keys(c.allocatable).sort();
      return el("tr", { "data-cluster": c.name }, td(c.name), td(c.tier), td(c.site), td(c.state),
        td(c.capacitySource), td(c.capacityAgeSeconds === null ? "never" : `${c.capacityAgeSeconds.toFixed(1)} s`),
        td(c.runningJobs, "num"),
        td(Object.entries(c.price || {}).map(([r, p]) => `${r} ${p}/h`).join(", ") || "—"),
        el("td", {}, el("div", { class: "bars" }, names.map((r) => {
          const total = quantity(c.allocatable[r]);
          const taken = Math.max(0, total - quantity(c.free[r]));
          return [el("span", {}, r), bar(taken, 0, total), el("span", { class: "muted" },
            `${c.free[r] || "0"} free of ${c.allocatable[r]}`)];
        }))));
    }));
  };
  const grid = table(["Cluster", "Tier", "Site", "State", "Capacity from", "Capacity age", "#Running", "Price",
    "In use (bar) · free of allocatable"], []);
  grid.replaceChild(body, grid.querySelector("tbody"));
  show(el("h1", {}, "Clusters"), status, grid);
  poll(draw, status);
}

// ---- usage
function hbars(rows, width) {
  const rowHeight = 22;
  const labelWidth = 170;
  const top = Math.max(...rows.map((r) => Math.max(r.value, r.limit || 0)), 1e-9);
  const chart = svg("svg", { class: "chart", width, height: rows.length * rowHeight + 4, role: "img" });
  rows.forEach((r, i) => {
    const y = i * rowHeight + 2;
    const span = width - labelWidth - 230;
    chart.append(svg("text", { x: 0, y: y + 14 }, r.label));
    chart.append(svg("rect", { x: labelWidth, y: y + 3, width: span, height: 14, fill: "#e5e7eb" }));
    const over = r.limit !== null && r.limit !== undefined && r.value > r.limit;
    chart.append(svg("rect", { x: labelWidth, y: y + 3, width: Math.max(1, (span * r.value) / top), height: 14,
      fill: over ? "#b91c1c" : "#2563eb" }));
    if (r.limit !== null && r.limit !== undefined) {
      chart.append(svg("rect", { x: labelWidth + (span * r.limit) / top - 1, y: y, width: 2, height: 20,
        fill: "#15803d" }));
    }
    chart.append(svg("text", { x: labelWidth + span + 6, y: y + 14 }, r.note));
  });
  return chart;
}

function usagePage() {
  const params = new URLSearchParams(location.search);
  const since = params.get("since") || "30d";
  const by = params.get("by") || "queue";
  const form = el("form", { class: "filters", id: "usage-form" },
    el("label", {}, "Since", el("select", { name: "since" }, ["1h", "24h", "7d", "30d", "all"].map((s) =>
      el("option", { value: s, selected: s === since }, s)))),
    el("label", {}, "By", el("select", { name: "by" }, ["queue", "class", "cluster", "user", "array"].map((s) =>
      el("option", { value: s, selected: s === by }, s)))),
    el("button", { class: "action", type: "submit" }, "Show"));
  const status = el("div");
  const content = el("div", { id: "usage" });
  const draw = async () => {
    const usage = await api(`/api/v1/usage?${new URLSearchParams({ since, by })}`);
    const cur = usage.currency;
    const resources = Object.keys(usage.total.resourceHours);
    const parts = [el("p", { class: "muted" }, `From ${when(usage.since) || "the start"} to ${when(usage.until)}.`),
      el("h2", {}, `Chargeback by ${usage.by}`),
      table([usage.by, "#Attempts", ...resources.map((r) => `#${r} hours`), "#Cost"],
        [...usage.groups.map((g) => el("tr", {}, td(g.group), td(g.attempts, "num"),
          resources.map((r) => td((g.resourceHours[r] || 0).toFixed(2), "num")), td(money(g.cost, cur), "num"))),
        el("tr", {}, el("th", {}, "total"), td(usage.total.attempts, "num"),
          resources.map((r) => td(usage.total.resourceHours[r].toFixed(2), "num")),
          td(money(usage.total.cost, cur), "num"))])];
    if (usage.groups.length) {
      parts.push(hbars(usage.groups.map((g) => ({ label: g.group, value: g.cost, note: money(g.cost, cur) })), 760));
    }
    parts.push(el("h2", {}, "Burst spend against budgets"));
    if (!usage.burst.length) parts.push(el("p", { class: "muted" }, "No burst policies."));
    else {
      const name = (b) => (b.queue ? `${b.policy} / ${b.queue}` : b.policy);
      parts.push(el("p", { class: "legend" }, el("span", {}, el("i", { class: "used" }), "spent today"),
        el("span", {}, el("i", { class: "guaranteed" }), "budget per day")));
      parts.push(hbars(usage.burst.map((b) => ({ label: name(b), value: b.spentToday, limit: b.budgetPerDay,
        note: `${money(b.spentToday, cur)} of ${b.budgetPerDay === null ? "no limit" : money(b.budgetPerDay, cur)}` })),
      760));
      parts.push(table(["Policy / queue", "#Spent in window", "#Attempts", "#Spent today", "#Budget per day",
        "#Rate per hour", "#Budget per hour", "In use", "Max"], usage.burst.map((b) => el("tr", {}, td(name(b)),
        td(money(b.spentInWindow, cur), "num"), td(b.attempts, "num"), td(money(b.spentToday, cur), "num"),
        td(b.budgetPerDay === null ? "—" : money(b.budgetPerDay, cur), "num"), td(money(b.ratePerHour, cur), "num"),
        td(b.budgetPerHour === null ? "—" : money(b.budgetPerHour, cur), "num"),
        td(Object.entries(b.resourcesInUse).map(([k, v]) => `${k}: ${v}`).join(", ")),
        td(Object.entries(b.maxResources).map(([k, v]) => `${k}: ${v}`).join(", "))))));
    }
    content.replaceChildren(...parts);
  };
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    location.assign(`/usage?${new URLSearchParams(new FormData(form))}`);
  });
  show(el("h1", {}, "Usage"), form, status, content);
  poll(draw, status);
}

// ---- the page the path names
function start() {
  document.getElementById("logout").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    location.assign("/login");
  });
  const path = location.pathname;
  if (path === "/login") return loginPage();
  if (!sessionStorage.getItem(TOKEN_KEY)) return toLogin();
  const page = path === "/" || path.startsWith("/jobs") ? "jobs" : path.slice(1);
  for (const link of document.querySelectorAll("#nav a")) link.classList.toggle("current", link.dataset.page === page);
  const job = /^\/jobs\/([^/]+)$/.exec(path);
  if (job) return jobPage(decodeURIComponent(job[1]));
  if (path === "/queues") return queuesPage();
  if (path === "/clusters") return clustersPage();
  if (path === "/usage") return usagePage();
  return jobsPage();
}

start();
