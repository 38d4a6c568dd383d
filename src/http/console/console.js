// twinhub operator console. No framework and no build step: the server embeds this file as is.
//
// Every request is an ordinary API request signed with a SAS token computed here, from the connection
// string the operator signed in with (kept in sessionStorage: it dies with the tab).
"use strict";

const SESSION_KEY = "twinhub.session";
const TOKEN_LIFETIME_S = 3600;
const API_VERSION = "2021-04-12";
const READ_ONLY_POLICIES = ["registryRead"];

const $ = (id) => document.getElementById(id);
const el = (tag, props = {}, ...children) => {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(props)) {
    if (k === "class") e.className = v;
    else if (k === "on") for (const [ev, f] of Object.entries(v)) e.addEventListener(ev, f);
    else if (k in e) e[k] = v;
    else e.setAttribute(k, v);
  }
  for (const c of children) if (c !== null && c !== undefined) e.append(c instanceof Node ? c : String(c));
  return e;
};
const json = (v) => JSON.stringify(v, null, 2);

// ---- credentials ------------------------------------------------------------------------------

/** Python's urllib.parse.quote(s, safe=""), which the Azure SDKs use for the token resource. */
function quote(s) {
  return encodeURIComponent(s).replace(/[!'()*]/g, (c) => "%" + c.charCodeAt(0).toString(16).toUpperCase());
}
/** One path segment (a device or module id), as the service SDKs encode it. */
const seg = (s) => encodeURIComponent(s);

function parseConnectionString(cs) {
  const parts = {};
  for (const p of cs.trim().split(";")) {
    const i = p.indexOf("=");
    if (i > 0) parts[p.slice(0, i).trim()] = p.slice(i + 1).trim();
  }
  for (const k of ["HostName", "SharedAccessKeyName", "SharedAccessKey"]) {
    if (!parts[k]) {
      if (k === "SharedAccessKeyName" && parts.DeviceId) throw new Error("this is a device connection string: sign in with a shared access policy (for example iothubowner)");
      throw new Error(`the connection string has no ${k}`);
    }
  }
  let key;
  try { key = Uint8Array.from(atob(parts.SharedAccessKey), (c) => c.charCodeAt(0)); }
  catch { throw new Error("SharedAccessKey is not base64"); }
  return { host: parts.HostName, policy: parts.SharedAccessKeyName, key: parts.SharedAccessKey, keyBytes: key };
}

let session = null;
let cachedToken = null;

async function token() {
  const now = Math.floor(Date.now() / 1000);
  if (cachedToken && cachedToken.expiry - now > 300) return cachedToken.value;
  if (!crypto.subtle) throw new Error("this browser offers no WebCrypto here (open the console over HTTPS)");
  const expiry = now + TOKEN_LIFETIME_S;
  const sr = quote(session.host);
  const key = await crypto.subtle.importKey("raw", session.keyBytes, { name: "HMAC", hash: "SHA-256" }, false, ["sign"]);
  const mac = new Uint8Array(await crypto.subtle.sign("HMAC", key, new TextEncoder().encode(`${sr}\n${expiry}`)));
  const sig = quote(btoa(String.fromCharCode(...mac)));
  cachedToken = { expiry, value: `SharedAccessSignature sr=${sr}&sig=${sig}&se=${expiry}&skn=${quote(session.policy)}` };
  return cachedToken.value;
}

// ---- API ----------------------------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

/** IoT Hub's error body is {"Message": "ErrorCode:<code>;<text>", ...}: show code and text. */
function apiError(status, text) {
  let code = `HTTP ${status}`, message = text || `HTTP ${status}`;
  try {
    const b = JSON.parse(text);
    const m = /^ErrorCode:([^;]*);([\s\S]*)$/.exec(b.Message || "");
    if (m) { code = m[1]; message = m[2]; } else if (b.Message) message = b.Message;
  } catch { /* not JSON: keep the text */ }
  return new ApiError(status, code, message);
}

async function api(method, path, { body, headers = {}, signal } = {}) {
  const sep = path.includes("?") ? "&" : "?";
  const h = { Authorization: await token(), ...headers };
  if (body !== undefined) h["Content-Type"] = "application/json";
  const resp = await fetch(`${path}${sep}api-version=${API_VERSION}`, {
    method, headers: h, body: body === undefined ? undefined : JSON.stringify(body), signal,
  });
  const text = await resp.text();
  if (!resp.ok) throw apiError(resp.status, text);
  return { status: resp.status, headers: resp.headers, body: text ? JSON.parse(text) : null };
}

// ---- messages and page plumbing -----------------------------------------------------------------

function showMessage(text, kind = "error") {
  const m = $("message");
  m.textContent = text;
  m.className = kind;
  m.hidden = false;
}
function clearMessage() { $("message").hidden = true; }
function showError(e) {
  showMessage(e instanceof ApiError ? `${e.code}: ${e.message}` : String(e.message || e));
}

/** Work a page started (timers, streams): stopped when the page changes. */
let pageCleanup = [];
function onLeave(f) { pageCleanup.push(f); }
function every(ms, f) {
  const t = setInterval(f, ms);
  onLeave(() => clearInterval(t));
}

function showPage(name) {
  for (const p of document.querySelectorAll(".page")) p.hidden = p.id !== `page-${name}`;
  for (const a of document.querySelectorAll("#nav a")) a.classList.toggle("current", a.dataset.page === name);
}

const routes = {
  devices: () => devicesPage(),
  device: (id) => devicePage(id),
  twin: (id, mid) => twinPage(id, mid),
  query: () => queryPage(),
  jobs: () => jobsPage(),
  configurations: () => configurationsPage(),
  cluster: () => clusterPage(),
};

async function route() {
  for (const f of pageCleanup.splice(0)) f();
  clearMessage();
  if (!session) { showPage("signin"); return; }
  const [name, ...args] = location.hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
  const page = routes[name] ? name : "devices";
  showPage(page);
  try { await routes[page](...args); } catch (e) { showError(e); }
}

// ---- sign-in ------------------------------------------------------------------------------------

function startSession(s) {
  session = s;
  cachedToken = null;
  document.body.classList.toggle("read-only", READ_ONLY_POLICIES.includes(s.policy));
  $("nav").hidden = false;
  $("sign-out").hidden = false;
  $("who").textContent = `${s.policy}@${s.host}`;
}

async function signIn(ev) {
  ev.preventDefault();
  clearMessage();
  let s;
  try { s = parseConnectionString($("signin-cs").value); } catch (e) { showMessage(e.message); return; }
  startSession(s);
  try {
    await api("GET", "/statistics/devices");
  } catch (e) {
    signOut();
    showMessage(e instanceof ApiError && e.status === 401
      ? `Sign-in refused: ${e.message}` : `Sign-in failed: ${e.message}`);
    return;
  }
  sessionStorage.setItem(SESSION_KEY, JSON.stringify({ host: s.host, policy: s.policy, key: s.key }));
  $("signin-cs").value = "";
  if (!location.hash || location.hash === "#/signin") location.hash = "#/devices"; else route();
}

function signOut() {
  sessionStorage.removeItem(SESSION_KEY);
  session = null;
  cachedToken = null;
  $("nav").hidden = true;
  $("sign-out").hidden = true;
  $("who").textContent = "";
  route();
}

// ---- devices ------------------------------------------------------------------------------------

const DEVICE_PAGE = 25;

async function devicesPage() {
  const tbody = $("device-table").tBodies[0];
  let continuation = null, shown = 0, condition = "";
  const load = async (reset) => {
    if (reset) { tbody.replaceChildren(); continuation = null; shown = 0; }
    const prefix = $("device-search").value.trim();
    condition = prefix ? ` WHERE STARTS_WITH(deviceId, '${prefix.replace(/'/g, "''")}')` : "";
    const headers = { "x-ms-max-item-count": String(DEVICE_PAGE) };
    if (continuation) headers["x-ms-continuation"] = continuation;
    const r = await api("POST", "/devices/query", {
      body: { query: `SELECT deviceId, status, connectionState, lastActivityTime, version FROM devices${condition}` }, headers,
    });
    for (const d of r.body) {
      tbody.append(el("tr", {},
        el("td", {}, el("a", { href: `#/device/${seg(d.deviceId)}`, className: "device-link" }, d.deviceId)),
        el("td", {}, d.status ?? ""), el("td", {}, d.connectionState ?? ""),
        el("td", {}, d.lastActivityTime ?? ""), el("td", {}, d.version ?? "")));
    }
    shown += r.body.length;
    continuation = r.headers.get("x-ms-continuation");
    $("device-more").hidden = !continuation;
    $("device-count").textContent = `${shown} device${shown === 1 ? "" : "s"} shown${continuation ? "" : " (all)"}`;
  };
  const guard = (f) => async (ev) => { ev?.preventDefault(); clearMessage(); try { await f(); } catch (e) { showError(e); } };
  $("device-search-form").onsubmit = guard(() => load(true));
  $("device-more").onclick = guard(() => load(false));
  $("device-create-form").onsubmit = guard(async () => {
    const id = $("device-create-id").value.trim();
    if (!id) throw new Error("give the new device an id");
    await api("PUT", `/devices/${seg(id)}`, { body: { deviceId: id } });
    $("device-create-id").value = "";
    location.hash = `#/device/${seg(id)}`;
  });
  await load(true);
}

/** What a device SDK connects with: the hub's host name without the HTTPS port (devices dial MQTT on
 * 8883, or WebSockets on 443, of the same host). */
function connectionString(deviceId, key, moduleId) {
  return `HostName=${session.host.replace(/:\d+$/, "")};DeviceId=${deviceId}${moduleId ? `;ModuleId=${moduleId}` : ""};SharedAccessKey=${key}`;
}

function keyFacts(dl, identity, moduleId) {
  dl.replaceChildren();
  const auth = identity.authentication || {};
  if (auth.type === "sas" && auth.symmetricKey) {
    for (const which of ["primary", "secondary"]) {
      const key = auth.symmetricKey[`${which}Key`];
      dl.append(el("dt", {}, `${which} key`), el("dd", { className: `key-${which}` }, key));
      dl.append(el("dt", {}, `${which} connection string`),
        el("dd", { className: `cs-${which}` }, connectionString(identity.deviceId, key, moduleId)));
    }
  } else if (auth.x509Thumbprint) {
    dl.append(el("dt", {}, "authentication"), el("dd", {}, `${auth.type}`));
    dl.append(el("dt", {}, "primary thumbprint"), el("dd", {}, auth.x509Thumbprint.primaryThumbprint ?? ""));
  } else {
    dl.append(el("dt", {}, "authentication"), el("dd", {}, auth.type ?? "none"));
  }
}

async function devicePage(id) {
  $("device-id").textContent = id;
  $("device-twin-link").href = `#/twin/${seg(id)}`;
  const d = (await api("GET", `/devices/${seg(id)}`)).body;
  const facts = $("device-facts");
  facts.replaceChildren();
  for (const k of ["status", "connectionState", "lastActivityTime", "etag", "generationId"]) {
    facts.append(el("dt", {}, k), el("dd", {}, d[k] ?? ""));
  }
  keyFacts($("device-keys"), d);
  $("device-delete").onclick = async () => {
    if (!confirm(`Delete device ${id} and its twin?`)) return;
    try {
      await api("DELETE", `/devices/${seg(id)}`, { headers: { "If-Match": "*" } });
      location.hash = "#/devices";
    } catch (e) { showError(e); }
  };
  const loadModules = async () => {
    const mods = (await api("GET", `/devices/${seg(id)}/modules`)).body;
    const tbody = $("module-table").tBodies[0];
    tbody.replaceChildren();
    for (const m of mods) {
      const key = m.authentication?.symmetricKey?.primaryKey;
      const del = el("button", { className: "write danger module-delete", on: { click: async () => {
        if (!confirm(`Delete module ${m.moduleId} of ${id} and its twin?`)) return;
        try {
          await api("DELETE", `/devices/${seg(id)}/modules/${seg(m.moduleId)}`, { headers: { "If-Match": "*" } });
          await loadModules();
        } catch (e) { showError(e); }
      } } }, "Delete");
      tbody.append(el("tr", { "data-module": m.moduleId },
        el("td", {}, el("a", { href: `#/twin/${seg(id)}/${seg(m.moduleId)}` }, m.moduleId)),
        el("td", {}, m.connectionState ?? ""),
        el("td", {}, key ? connectionString(id, key, m.moduleId) : ""),
        el("td", {}, del)));
    }
    if (!mods.length) tbody.append(el("tr", {}, el("td", { colSpan: 4 }, "No modules.")));
  };
  $("module-create-form").onsubmit = async (ev) => {
    ev.preventDefault();
    const mid = $("module-create-id").value.trim();
    try {
      if (!mid) throw new Error("give the new module an id");
      await api("PUT", `/devices/${seg(id)}/modules/${seg(mid)}`, { body: { deviceId: id, moduleId: mid } });
      $("module-create-id").value = "";
      await loadModules();
    } catch (e) { showError(e); }
  };
  await loadModules();
}

// ---- twin ---------------------------------------------------------------------------------------

/** A section without the service's bookkeeping ($metadata, $version): what an operator edits. */
function withoutBookkeeping(section) {
  const out = {};
  for (const [k, v] of Object.entries(section || {})) if (!k.startsWith("$")) out[k] = v;
  return out;
}

async function twinPage(id, moduleId) {
  const path = moduleId ? `/twins/${seg(id)}/modules/${seg(moduleId)}` : `/twins/${seg(id)}`;
  $("twin-id").textContent = moduleId ? `${id} / ${moduleId}` : id;
  $("twin-changes").replaceChildren();
  let twin = null;
  // The version the operator's edit starts from: a save carries its etag, so a change made meanwhile
  // (seen live, or not) is a conflict the operator sees, never a silent overwrite.
  let base = null;
  const setBase = (t) => {
    base = { etag: t.etag, version: t.version };
    $("twin-base-version").textContent = t.version;
    $("twin-base-etag").textContent = t.etag;
    $("twin-stale").hidden = true;
  };
  const render = (t, { resetEditor = false } = {}) => {
    twin = t;
    const desired = t.properties?.desired || {}, reported = t.properties?.reported || {};
    $("twin-version").textContent = t.version;
    $("twin-etag").textContent = t.etag;
    $("twin-desired-version").textContent = desired.$version ?? "";
    $("twin-reported-version").textContent = reported.$version ?? "";
    $("twin-desired").textContent = json(withoutBookkeeping(desired));
    $("twin-reported").textContent = json(withoutBookkeeping(reported));
    $("twin-tags").textContent = json(t.tags || {});
    $("twin-json").textContent = json(t);
    if (resetEditor) {
      $("twin-patch").value = json({ tags: t.tags || {}, properties: { desired: withoutBookkeeping(desired) } });
      setBase(t);
    } else if (base && base.etag !== t.etag) {
      $("twin-stale").hidden = false;
    }
  };
  const reload = async (opts) => render((await api("GET", path)).body, opts);
  await reload({ resetEditor: true });

  $("twin-save").onclick = async () => {
    clearMessage();
    let patch;
    try { patch = JSON.parse($("twin-patch").value); } catch (e) { showMessage(`The patch is not JSON: ${e.message}`); return; }
    const sent = base;
    try {
      const t = (await api("PATCH", path, { body: patch, headers: { "If-Match": `"${sent.etag}"` } })).body;
      render(t);
      setBase(t);
      showMessage(`Twin updated to version ${t.version}.`, "info");
    } catch (e) {
      if (e instanceof ApiError && e.status === 412) {
        try { await reload(); setBase(twin); } catch { /* keep the old base: the next save conflicts again */ }
        showMessage(`Conflict: the twin changed since your edit began (version ${sent.version}, now ${twin.version}). ` +
          "The current twin is shown and your patch is kept: apply it again to write it over the new version.");
      } else showError(e);
    }
  };

  // Live updates: the change feed of this twin, over fetch (EventSource cannot send a token).
  const ctl = new AbortController();
  onLeave(() => ctl.abort());
  let feedPath = `/twin-changes?deviceId=${seg(id)}`;
  if (moduleId) feedPath += `&moduleId=${seg(moduleId)}`;
  followFeed(feedPath, ctl.signal, async (ev) => {
    if (ev.event !== "twinChangeEvents" && ev.event !== "resync") return;
    let what = ev.event;
    try {
      const d = JSON.parse(ev.data);
      const body = d.body || {};
      const changed = Object.keys(body.properties || {}).concat(body.tags ? ["tags"] : []);
      what = `version ${body.version ?? "?"}: ${changed.join(", ") || "changed"}`;
    } catch { /* show the event name */ }
    $("twin-changes").prepend(el("li", {}, `${new Date().toLocaleTimeString()} ${what}`));
    try { await reload(); } catch (e) { showError(e); }
  });
}

/**
 * Reads an SSE stream with fetch and calls `onEvent({event, id, data})` per message; reconnects
 * with Last-Event-ID after a drop, until `signal` aborts.
 */
async function followFeed(path, signal, onEvent) {
  const live = $("twin-live");
  let lastId = null;
  while (!signal.aborted) {
    try {
      const headers = { Authorization: await token(), Accept: "text/event-stream" };
      if (lastId) headers["Last-Event-ID"] = lastId;
      const resp = await fetch(`${path}&api-version=${API_VERSION}`, { headers, signal });
      if (!resp.ok) throw apiError(resp.status, await resp.text());
      live.classList.add("on");
      const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += value.replace(/\r\n/g, "\n");
        let cut;
        while ((cut = buf.indexOf("\n\n")) >= 0) {
          const block = buf.slice(0, cut);
          buf = buf.slice(cut + 2);
          const ev = { event: "message", id: null, data: "" };
          for (const line of block.split("\n")) {
            if (line.startsWith(":")) continue;
            const i = line.indexOf(":");
            const field = i < 0 ? line : line.slice(0, i);
            const val = i < 0 ? "" : line.slice(i + 1).replace(/^ /, "");
            if (field === "event") ev.event = val;
            else if (field === "id") ev.id = val;
            else if (field === "data") ev.data += (ev.data ? "\n" : "") + val;
          }
          if (ev.id) lastId = ev.id;
          if (ev.data) await onEvent(ev);
        }
      }
    } catch (e) {
      if (signal.aborted) return;
      if (e instanceof ApiError) showError(e);
    }
    live.classList.remove("on");
    await new Promise((r) => setTimeout(r, 1000));
  }
}

// ---- query --------------------------------------------------------------------------------------

function cell(v) {
  if (v === null || v === undefined) return el("td", {}, "");
  if (typeof v === "object") return el("td", {}, el("pre", {}, json(v)));
  return el("td", {}, String(v));
}

async function queryPage() {
  const table = $("query-table");
  let continuation = null, columns = [], shown = 0, text = "";
  const run = async (fresh) => {
    $("query-error").hidden = true;
    if (fresh) {
      text = $("query-text").value;
      continuation = null; columns = []; shown = 0;
      table.tHead.replaceChildren(); table.tBodies[0].replaceChildren();
    }
    const headers = { "x-ms-max-item-count": String($("query-page-size").value || 50) };
    if (continuation) headers["x-ms-continuation"] = continuation;
    let r;
    try {
      r = await api("POST", "/devices/query", { body: { query: text }, headers });
    } catch (e) {
      $("query-error").textContent = e instanceof ApiError ? `${e.code}: ${e.message}` : String(e.message || e);
      $("query-error").hidden = false;
      return;
    }
    const rows = r.body.map((x) => (x !== null && typeof x === "object" && !Array.isArray(x) ? x : { value: x }));
    for (const row of rows) for (const k of Object.keys(row)) if (!columns.includes(k)) columns.push(k);
    table.tHead.replaceChildren(el("tr", {}, ...columns.map((c) => el("th", {}, c))));
    for (const row of rows) table.tBodies[0].append(el("tr", {}, ...columns.map((c) => cell(row[c]))));
    shown += rows.length;
    continuation = r.headers.get("x-ms-continuation");
    $("query-more").hidden = !continuation;
    $("query-count").textContent = `${shown} result${shown === 1 ? "" : "s"}${continuation ? ", more available" : ""}`;
  };
  $("query-form").onsubmit = (ev) => { ev.preventDefault(); run(true); };
  $("query-more").onclick = () => run(false);
}

// ---- jobs and configurations -------------------------------------------------------------------

async function jobsPage() {
  const load = async () => {
    const r = await api("GET", "/jobs/v2/query");
    const tbody = $("job-table").tBodies[0];
    tbody.replaceChildren();
    const jobs = (r.body.items || []).sort((a, b) => String(b.createdTime).localeCompare(String(a.createdTime)));
    for (const j of jobs) {
      const s = j.deviceJobStatistics || {};
      const done = (s.succeededCount || 0) + (s.failedCount || 0);
      const active = ["queued", "scheduled", "running", "enqueued"].includes(j.status);
      const cancel = el("button", { className: "write", hidden: !active, on: { click: async () => {
        try { await api("POST", `/jobs/v2/${seg(j.jobId)}/cancel`); await load(); } catch (e) { showError(e); }
      } } }, "Cancel");
      tbody.append(el("tr", {}, el("td", {}, j.jobId), el("td", {}, j.type), el("td", {}, j.status),
        el("td", {}, el("progress", { max: Math.max(s.deviceCount || 0, 1), value: done }),
          ` ${done}/${s.deviceCount || 0}${s.failedCount ? ` (${s.failedCount} failed)` : ""}`),
        el("td", {}, j.createdTime ?? ""), el("td", {}, cancel)));
    }
    if (!jobs.length) tbody.append(el("tr", {}, el("td", { colSpan: 6 }, "No jobs.")));
  };
  await load();
  every(3000, () => load().catch(showError));
}

async function configurationsPage() {
  const load = async () => {
    const r = await api("GET", "/configurations?top=100");
    const tbody = $("config-table").tBodies[0];
    tbody.replaceChildren();
    for (const c of r.body) {
      const res = c.systemMetrics?.results || {};
      const del = el("button", { className: "write danger", on: { click: async () => {
        if (!confirm(`Delete configuration ${c.id}? Twins keep the properties it wrote.`)) return;
        try { await api("DELETE", `/configurations/${seg(c.id)}`, { headers: { "If-Match": "*" } }); await load(); }
        catch (e) { showError(e); }
      } } }, "Delete");
      tbody.append(el("tr", {}, el("td", {}, c.id), el("td", {}, c.priority), el("td", {}, c.targetCondition),
        el("td", {}, res.targetedCount ?? ""), el("td", {}, res.appliedCount ?? ""), el("td", {}, del)));
    }
    if (!r.body.length) tbody.append(el("tr", {}, el("td", { colSpan: 6 }, "No configurations.")));
  };
  await load();
  every(5000, () => load().catch(showError));
}

// ---- cluster ------------------------------------------------------------------------------------

/** Prometheus text format: {name: [{labels, value}]} for the series we chart. */
function parseMetrics(text) {
  const out = {};
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    // A label value may hold `}` (route="/twins/{id}"), so the label set is read as quoted strings.
    const m = /^([a-zA-Z_:][\w:]*)(\{((?:[^"}]|"(?:[^"\\]|\\.)*")*)\})?\s+(\S+)/.exec(line);
    if (!m) continue;
    const labels = {};
    for (const p of (m[3] || "").matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) labels[p[1]] = p[2];
    (out[m[1]] ||= []).push({ labels, value: Number(m[4]) });
  }
  return out;
}

/** Requests so far and the latency histogram's cumulative buckets, summed over routes. */
function requestTotals(metrics) {
  const total = (metrics.twinhub_http_requests_total || []).reduce((a, s) => a + s.value, 0);
  const buckets = new Map();
  for (const s of metrics.twinhub_http_request_duration_seconds_bucket || []) {
    const le = s.labels.le === "+Inf" ? Infinity : Number(s.labels.le);
    buckets.set(le, (buckets.get(le) || 0) + s.value);
  }
  return { total, buckets };
}

/** The 99th percentile (upper bucket bound) of the requests between two snapshots. */
function p99Between(before, after) {
  const bounds = [...after.buckets.keys()].sort((a, b) => a - b);
  const count = (after.buckets.get(Infinity) || 0) - (before.buckets.get(Infinity) || 0);
  if (count <= 0) return 0;
  for (const le of bounds) {
    if ((after.buckets.get(le) || 0) - (before.buckets.get(le) || 0) >= 0.99 * count) return le;
  }
  return bounds[bounds.length - 1];
}

/** Draws a line of the samples, newest on the right. The canvas also carries the figures as text
 * (its `aria-label`, and `data-now`/`data-peak`/`data-samples`), for screen readers and for tests that
 * must not guess from antialiased pixels. */
function drawChart(canvas, points, unit, what) {
  const now = points.length ? points[points.length - 1] : null;
  const peak = points.length ? Math.max(...points) : null;
  canvas.dataset.samples = String(points.length);
  canvas.dataset.now = now === null ? "" : String(now);
  canvas.dataset.peak = peak === null ? "" : String(peak);
  canvas.setAttribute("role", "img");
  canvas.setAttribute("aria-label", now === null ? `${what}: no samples yet`
    : `${what}: now ${now.toFixed(1)}${unit}, peak ${peak.toFixed(1)}${unit} over the last ${points.length} samples`);
  const ctx = canvas.getContext("2d");
  const w = canvas.width, h = canvas.height, pad = 22;
  ctx.clearRect(0, 0, w, h);
  const max = Math.max(1, ...points);
  ctx.strokeStyle = "#d8dce4";
  ctx.strokeRect(pad, 4, w - pad - 4, h - pad);
  ctx.fillStyle = "#667";
  ctx.font = "11px sans-serif";
  ctx.fillText(`${max.toFixed(max < 10 ? 1 : 0)}${unit}`, 2, 12);
  ctx.fillText(`now ${now === null ? "–" : now.toFixed(1)}${unit}`, w - 100, h - 6);
  if (points.length < 2) return;
  ctx.strokeStyle = "#1f5fbf";
  ctx.lineWidth = 2;
  ctx.beginPath();
  points.forEach((p, i) => {
    const x = pad + (i * (w - pad - 4)) / (points.length - 1);
    const y = 4 + (h - pad) * (1 - p / max);
    if (i === 0) ctx.moveTo(x, y); else ctx.lineTo(x, y);
  });
  ctx.stroke();
}

async function clusterPage() {
  const rates = [], p99s = [], history = 60;
  let prev = null, prevAt = 0;
  const leaders = new Map();
  const sample = async () => {
    const resp = await fetch("/metrics");
    if (!resp.ok) return;
    const now = performance.now();
    const totals = requestTotals(parseMetrics(await resp.text()));
    if (prev) {
      rates.push(Math.max(0, ((totals.total - prev.total) * 1000) / (now - prevAt)));
      p99s.push(p99Between(prev, totals) * 1000);
      if (rates.length > history) { rates.shift(); p99s.shift(); }
      drawChart($("chart-rate"), rates, "/s", "Requests per second");
      drawChart($("chart-p99"), p99s, " ms", "p99 latency");
    }
    prev = totals;
    prevAt = now;
  };
  const load = async () => {
    const st = (await api("GET", "/cluster/status")).body;
    $("cluster-node").textContent = st.node_id;
    $("cluster-ready").textContent = st.ready ? "ready: every shard it hosts has a leader" : "not ready: a shard it hosts has no leader";
    const map = st.map || {};
    const placed = map.placement?.shards || [];
    const local = new Map((st.shards || []).map((s) => [s.shard, s]));
    const count = Math.max(placed.length, ...(st.shards || []).map((s) => s.shard + 1), 0);
    const shardRows = [], replicasOf = new Map(), leadsOf = new Map();
    for (let i = 0; i < count; i++) {
      const s = local.get(i);
      const replicas = placed[i] ? placed[i].replicas : (s ? s.voters : []);
      for (const n of replicas) replicasOf.set(n, (replicasOf.get(n) || 0) + 1);
      const leader = s ? s.leader : null;
      if (leader !== null && leader !== undefined) {
        leadsOf.set(leader, (leadsOf.get(leader) || 0) + 1);
        const before = leaders.get(i);
        if (before !== undefined && before !== leader) {
          $("cluster-changes").prepend(el("li", {}, `${new Date().toLocaleTimeString()} shard ${i}: leader ${before ?? "none"} → ${leader} (term ${s.term})`));
        }
        leaders.set(i, leader);
      }
      const lag = s && s.lag ? Object.entries(s.lag).map(([n, l]) => `${n}: ${l}`).join(", ") : "";
      shardRows.push(el("tr", {}, el("td", {}, i), el("td", {}, replicas.join(", ")),
        el("td", { className: "shard-leader" }, s ? (s.leader ?? "none") : "(not hosted here)"),
        el("td", {}, s ? s.term : ""), el("td", {}, s ? s.committed : ""), el("td", {}, lag)));
    }
    $("cluster-shards").tBodies[0].replaceChildren(...shardRows);
    const members = Object.entries(map.members || {});
    if (!members.length) members.push([String(st.node_id), { addr: "(single node)", state: "Active" }]);
    $("cluster-nodes").tBodies[0].replaceChildren(...members.map(([id, m]) => el("tr", {},
      el("td", {}, id), el("td", {}, m.addr), el("td", {}, m.state),
      el("td", {}, replicasOf.get(Number(id)) || 0), el("td", {}, leadsOf.get(Number(id)) || 0))));
  };
  // The timer starts before the first round is awaited: a first fetch that fails (a restarting node)
  // must not leave the page without its periodic refresh.
  every(2000, () => { load().catch(showError); sample().catch(() => {}); });
  sample().catch(() => {});
  await load();
}

// ---- start --------------------------------------------------------------------------------------

document.addEventListener("DOMContentLoaded", () => {
  $("signin-form").addEventListener("submit", signIn);
  $("sign-out").addEventListener("click", () => { signOut(); location.hash = ""; });
  window.addEventListener("hashchange", route);
  const saved = sessionStorage.getItem(SESSION_KEY);
  if (saved) {
    try {
      const s = JSON.parse(saved);
      startSession(parseConnectionString(`HostName=${s.host};SharedAccessKeyName=${s.policy};SharedAccessKey=${s.key}`));
    } catch { sessionStorage.removeItem(SESSION_KEY); }
  }
  route();
});
