// meshcat dashboard: the views. The overview (summary, zones, a cluster table that
// renders only the rows in sight, so 10,000 clusters cost what 20 do), the cluster
// view (metadata, drift, recent changes, callers and callees, instances with their
// metrics and a chart of recent values, the sidecar log level, the diagnosis and
// its recent changes) and the graph view
// (graph.js). The zones' control states and the sidecars' sync with them come from
// control.js. Every element tests rely on carries the data-testid of the contract.

import { ApiError, Catalog, call, clusterKey, enc, setToken, sleep, token } from "./live.js";
import { STATUS_ICON, badge, fmtInt, fmtLeft, fmtNum, h, identityBadge } from "./dom.js";
import { ClusterCalls, GraphPage, graphHash, parseGraphHash } from "./graph.js";
import { ClusterHistory, entryItem } from "./history.js";
import { ClusterSync, ZoneControls } from "./control.js";
import { ExpiringList, identityLine } from "./identity.js";

const $ = (id) => document.getElementById(id);
const VERDICT_ICON = { pass: "\u2714", fail: "\u2716", skipped: "\u2013" };
const LEVELS = ["error", "warn", "info", "debug"];
const SYMPTOMS = [
  ["", "All checks"],
  ["upstream_connect_error", "Upstream connect error"],
  ["no_healthy_upstream", "No healthy upstream"],
  ["ingress_502_503", "502 or 503 at the ingress"],
  ["missing_metrics", "Missing metrics"],
];
/** Samples of each instance's metrics kept for its chart. */
const HISTORY = 30;
const METRICS_EVERY_MS = 2000;
/** Up to this many zones the zone table starts open. */
const OPEN_ZONES = 6;

/** Only http(s) links and site paths become links: nothing else runs in this page. */
function safeHref(v) {
  if (typeof v !== "string" || !v) return null;
  if (/^https?:\/\//i.test(v)) return v;
  if (v.startsWith("/") && !v.startsWith("//")) return v;
  return null;
}

function linkOrText(v) {
  const href = safeHref(v);
  return href ? h("a", { href, rel: "noopener noreferrer", target: "_blank" }, v) : (v || "\u2014");
}

function fmtBytes(n) {
  if (!Number.isFinite(n)) return "\u2014";
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return `${fmtNum(n, i ? 1 : 0)} ${u[i]}`;
}
function fmtAge(ms) {
  if (!Number.isFinite(ms) || ms < 0) return "\u2014";
  let s = Math.floor(ms / 1000);
  const d = Math.floor(s / 86400); s -= d * 86400;
  const hh = Math.floor(s / 3600); s -= hh * 3600;
  const m = Math.floor(s / 60); s -= m * 60;
  if (d) return `${d}d ${hh}h`;
  if (hh) return `${hh}h ${m}m`;
  if (m) return `${m}m ${s}s`;
  return `${s}s`;
}
function fmtTime(ms) {
  if (!Number.isFinite(ms) || ms <= 0) return "\u2014";
  const d = new Date(ms);
  return d.toLocaleString(undefined, { dateStyle: "medium", timeStyle: "medium" });
}

// ---------------------------------------------------------------- token dialog

const dialog = $("token-dialog");
let dialogWaiters = [];

function askToken(reason) {
  $("token-reason").textContent = reason ||
    "The token is kept for this browser tab only and sent as a bearer token.";
  $("token-input").value = token();
  if (!dialog.open) dialog.showModal();
  $("token-input").focus();
  return new Promise((resolve) => dialogWaiters.push(resolve));
}

$("token-form").addEventListener("submit", (e) => {
  e.preventDefault();
  const v = e.submitter ? e.submitter.value : "save";
  dialog.close(v);
});
dialog.addEventListener("close", () => {
  const v = dialog.returnValue;
  if (v === "save") setToken($("token-input").value.trim());
  else if (v === "clear") setToken("");
  const changed = v === "save" || v === "clear";
  updateTokenButton();
  const waiters = dialogWaiters;
  dialogWaiters = [];
  waiters.forEach((w) => w(changed));
  if (changed) catalog.refresh();
});
$("token-button").addEventListener("click", () => askToken());

function updateTokenButton() {
  $("token-button").textContent = token() ? "Token \u2714" : "Token";
  $("token-button").setAttribute("aria-label", token() ? "API token (set)" : "API token (not set)");
}

/** Runs `fn`; on 401 or 403 asks for a token once and tries again. */
async function withToken(fn, why) {
  try {
    return await fn();
  } catch (e) {
    if (e instanceof ApiError && e.needsToken && (await askToken(`${e.message} ${why}`))) return fn();
    throw e;
  }
}

// ---------------------------------------------------------------- overview

const view = {
  search: "",
  status: "",
  zone: "",
  rows: [],
  focus: 0,
  rowH: 44,
  sorted: [],
  sortedDirty: true,
};

function hay(c) {
  return `${c.clusterName}\u0001${c.name || ""}\u0001${c.owner || ""}\u0001${c.capability || ""}`.toLowerCase();
}

function refilter() {
  if (view.sortedDirty) {
    view.sorted = [...catalog.clusters.values()].sort((a, b) =>
      a.zoneName < b.zoneName ? -1 : a.zoneName > b.zoneName ? 1 :
        a.clusterName < b.clusterName ? -1 : a.clusterName > b.clusterName ? 1 : 0);
    view.sortedDirty = false;
  }
  const q = view.search.trim().toLowerCase();
  view.rows = view.sorted.filter((c) =>
    (!view.status || c.status === view.status) &&
    (!view.zone || c.zoneName === view.zone) &&
    (!q || hay(c).includes(q)));
  view.focus = Math.min(view.focus, Math.max(0, view.rows.length - 1));
  $("spacer").style.height = `${view.rows.length * view.rowH}px`;
  $("table").setAttribute("aria-rowcount", String(view.rows.length + 1));
  const total = catalog.clusters.size;
  $("row-count").textContent = view.rows.length === total
    ? `${fmtInt(total)} clusters`
    : `${fmtInt(view.rows.length)} of ${fmtInt(total)} clusters`;
  renderRows();
}

function renderRows() {
  const vp = $("viewport");
  const hadFocus = vp.contains(document.activeElement);
  const first = Math.max(0, Math.floor(vp.scrollTop / view.rowH) - 5);
  const last = Math.min(view.rows.length, Math.ceil((vp.scrollTop + vp.clientHeight) / view.rowH) + 5);
  const rows = $("rows");
  rows.style.transform = `translateY(${first * view.rowH}px)`;
  const out = [];
  for (let i = first; i < last; i++) out.push(row(view.rows[i], i));
  if (!view.rows.length) {
    out.push(h("div", { class: "empty", role: "row" },
      h("span", { role: "gridcell" }, catalog.clusters.size ? "No cluster matches." : "No cluster registered yet.")));
  }
  rows.replaceChildren(...out);
  // For bench/dashboard.sh: when the first rows of the table were in the page.
  if (out.length && view.rows.length && !performance.getEntriesByName("meshcat-rows").length) {
    performance.mark("meshcat-rows");
  }
  if (hadFocus) {
    const el = rows.querySelector(`[data-index="${view.focus}"]`);
    if (el) el.focus({ preventScroll: true });
  }
}

/** A cluster's identity cell: its state and how long its soonest certificate has. */
function identityCell(c) {
  const id = c.identity;
  if (!id) return "\u2014";
  if (!Number.isFinite(id.expiresAtMs)) return identityBadge(id.state);
  return h("span", { title: `soonest expiry ${new Date(id.expiresAtMs).toISOString()}` },
    identityBadge(id.state), " ", fmtLeft(id.expiresAtMs));
}

function row(c, i) {
  const n = (c.instances || []).length;
  return h("div", {
    role: "row", class: "row", tabindex: i === view.focus ? "0" : "-1",
    "aria-rowindex": String(i + 2),
    dataset: { testid: "cluster-row", cluster: c.clusterName, zone: c.zoneName, status: c.status, identity: c.identity ? c.identity.state : "", index: String(i) },
    on: { click: () => { view.focus = i; openCluster(c); } },
  },
  h("span", { role: "gridcell", class: "c-name" }, c.clusterName,
    c.name && c.name !== c.clusterName ? h("span", { class: "sub" }, c.name) : null),
  h("span", { role: "gridcell", class: "c-zone" }, c.zoneName),
  h("span", { role: "gridcell", class: "c-owner" }, c.owner || ""),
  h("span", { role: "gridcell", class: "c-cap" }, c.capability || ""),
  h("span", { role: "gridcell", class: "c-ver" }, c.version || ""),
  h("span", { role: "gridcell", class: "c-status" }, badge(c.status)),
  h("span", { role: "gridcell", class: "c-identity" }, identityCell(c)),
  h("span", { role: "gridcell", class: "c-inst" }, c.authorized === false ? "\u2014" : String(n)),
  h("span", { role: "gridcell", class: "c-impact" }, c.businessImpact || ""));
}

function moveFocus(to) {
  if (!view.rows.length) return;
  view.focus = Math.max(0, Math.min(view.rows.length - 1, to));
  const vp = $("viewport");
  const top = view.focus * view.rowH;
  if (top < vp.scrollTop) vp.scrollTop = top;
  else if (top + view.rowH > vp.scrollTop + vp.clientHeight) vp.scrollTop = top + view.rowH - vp.clientHeight;
  renderRows();
  const el = $("rows").querySelector(`[data-index="${view.focus}"]`);
  if (el) el.focus({ preventScroll: true });
}

$("viewport").addEventListener("keydown", (e) => {
  const page = Math.max(1, Math.floor($("viewport").clientHeight / view.rowH) - 1);
  const keys = {
    ArrowDown: view.focus + 1, ArrowUp: view.focus - 1, PageDown: view.focus + page,
    PageUp: view.focus - page, Home: 0, End: view.rows.length - 1,
  };
  if (e.key in keys) {
    e.preventDefault();
    moveFocus(keys[e.key]);
  } else if (e.key === "Enter" || e.key === " ") {
    const c = view.rows[view.focus];
    if (c) { e.preventDefault(); openCluster(c); }
  }
});
let scrollQueued = false;
$("viewport").addEventListener("scroll", () => {
  if (scrollQueued) return;
  scrollQueued = true;
  requestAnimationFrame(() => { scrollQueued = false; renderRows(); });
});
$("search").addEventListener("input", (e) => { view.search = e.target.value; $("viewport").scrollTop = 0; refilter(); });
$("status-filter").addEventListener("change", (e) => { view.status = e.target.value; $("viewport").scrollTop = 0; refilter(); });
$("zone-filter").addEventListener("change", (e) => { view.zone = e.target.value; $("viewport").scrollTop = 0; refilter(); });

function readRowHeight() {
  const v = parseFloat(getComputedStyle(document.documentElement).getPropertyValue("--row-h"));
  const next = Number.isFinite(v) && v > 0 ? v : 44;
  if (next !== view.rowH) { view.rowH = next; refilter(); }
}
window.addEventListener("resize", () => { readRowHeight(); renderRows(); });

function renderSummary() {
  const t = catalog.totals;
  const el = $("summary");
  Object.assign(el.dataset, {
    clusters: String(t.clusters), stable: String(t.stable), warning: String(t.warning),
    down: String(t.down), instances: String(t.instances),
  });
  const item = (label, v, status) => h("div", {}, h("dt", {}, status ? badge(status) : label),
    h("dd", {}, fmtInt(v)));
  el.replaceChildren(
    item("Zones", t.zones), item("Clusters", t.clusters), item("Stable", t.stable, "stable"),
    item("Warning", t.warning, "warning"), item("Down", t.down, "down"), item("Live instances", t.instances));
}

/**
 * The zones as one compact table (a row each, so 200 zones stay a few hundred pixels
 * tall in a scrolling box), closed by default beyond a handful of zones; its summary
 * line says how many zones have clusters down or in warning.
 */
function renderZones() {
  const zones = [...catalog.zones.values()].sort((a, b) => (a.zoneName < b.zoneName ? -1 : 1));
  let down = 0, warning = 0;
  // While another view shows, the overview holds no zone rows: the zone's control
  // state hook is then the open view's alone. Showing the overview draws them again.
  const shown = !$("overview").hidden;
  const rows = (shown ? zones : []).map((z) => {
    const c = catalog.zoneCounts.get(z.zoneName);
    if (c && c.down) down++;
    else if (c && c.warning) warning++;
    const count = (n, status) => (c && n ? h("span", { class: `badge ${status}` }, h("span", { "aria-hidden": "true" }, STATUS_ICON[status]), fmtInt(n)) : (c ? "0" : "\u2014"));
    return h("tr", { dataset: { zone: z.zoneName } },
      h("th", { scope: "row" }, z.zoneName),
      h("td", { class: "num" }, c ? fmtInt(c.clusters) : "\u2014"),
      h("td", { class: "num" }, count(c && c.stable, "stable")),
      h("td", { class: "num" }, count(c && c.warning, "warning")),
      h("td", { class: "num" }, count(c && c.down, "down")),
      h("td", { class: "num z-inst" }, c ? fmtInt(c.instances) : "\u2014"),
      h("td", { class: "z-state" }, zoneControls.element(z.zoneName)),
      h("td", { class: "z-ctl" }, z.serverAddress, z.requestCluster ? ` \u00b7 edge ${z.requestCluster}` : "", z.useTls ? " \u00b7 TLS" : ""),
      h("td", { class: "z-act" },
        h("button", { type: "button", "aria-label": `Show the clusters of zone ${z.zoneName}`, on: { click: () => {
          $("zone-filter").value = z.zoneName; view.zone = z.zoneName; refilter(); $("search").focus();
        } } }, "Clusters"),
        " ", h("a", { href: graphHash({ zone: z.zoneName }), "aria-label": `Dependency graph of zone ${z.zoneName}` }, "Graph")));
  });
  $("zones").replaceChildren(...(rows.length || !shown ? rows
    : [h("tr", {}, h("td", { colspan: "9", class: "muted" }, "No zone registered yet."))]));
  const parts = [`${fmtInt(zones.length)} zone${zones.length === 1 ? "" : "s"}`];
  if (down) parts.push(`${fmtInt(down)} with clusters down`);
  if (warning) parts.push(`${fmtInt(warning)} with warnings`);
  $("zones-sum").textContent = parts.join(" \u00b7 ");
  const box = $("zones-box");
  if (!box.dataset.touched) box.open = zones.length <= OPEN_ZONES;
  const sel = $("zone-filter");
  const keep = sel.value;
  sel.replaceChildren(h("option", { value: "" }, "All zones"), ...zones.map((z) => h("option", { value: z.zoneName }, z.zoneName)));
  sel.value = catalog.zones.has(keep) ? keep : "";
  view.zone = sel.value;
}
// Once the reader opened or closed the zones, the page leaves them so.
$("zones-box").querySelector("summary").addEventListener("click", () => { $("zones-box").dataset.touched = "1"; });

function renderLive() {
  const el = document.querySelector("[data-testid=live-status]");
  el.dataset.state = catalog.mode;
  el.textContent = {
    live: "Live", polling: "Polling", connecting: "Connecting", offline: "API unreachable",
  }[catalog.mode] || catalog.mode;
  const notice = $("notice");
  const hidden = [...catalog.clusters.values()].some((c) => c.authorized === false);
  if (hidden) {
    notice.replaceChildren("Instances and metrics are hidden: the API wants the read token.",
      h("button", { type: "button", on: { click: () => askToken() } }, "Enter token"));
    notice.hidden = false;
  } else if (catalog.mode === "offline" && catalog.lastError) {
    notice.replaceChildren(`The API is not answering (${catalog.lastError.message}); retrying.`);
    notice.hidden = false;
  } else {
    notice.hidden = true;
  }
}

// ---------------------------------------------------------------- cluster view

/** The cluster page open now, or null. */
let page = null;

function openCluster(c) {
  location.hash = `#/c/${enc(c.zoneName)}/${enc(c.clusterName)}`;
}

/** The graph view open now, or null. */
let graphPage = null;

/** What the graph view and the calls need of the page. */
const graphApp = {
  withToken: (fn, why) => withToken(fn, why),
  askToken: (why) => askToken(why),
  zones: () => [...catalog.zones.keys()].sort(),
  liveHidden: () => catalog.liveHidden(),
  ready: () => catalog.ready,
};

function route() {
  // A control that changed the address (the graph's zone or depth) has its focus
  // back in the view built anew.
  const focusedId = document.activeElement && document.activeElement.id;
  const m = location.hash.match(/^#\/c\/([^/]+)\/([^/]+)$/);
  const graph = m ? null : parseGraphHash(location.hash);
  if (page) { page.close(); page = null; }
  if (graphPage) { graphPage.close(); graphPage = null; }
  $("overview").hidden = !!(m || graph);
  $("cluster-page").hidden = !m;
  $("graph-page").hidden = !graph;
  for (const a of document.querySelectorAll(".nav a")) {
    const here = a.dataset.view === (graph ? "graph" : m ? "" : "overview");
    if (here) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  if (!m) $("cluster-page").replaceChildren();
  if (!graph) $("graph-page").replaceChildren();
  if (m || graph) $("zones").replaceChildren();
  else expiring.changed();
  if (m) {
    page = new ClusterPage(decodeURIComponent(m[1]), decodeURIComponent(m[2]));
    window.scrollTo(0, 0);
  } else if (graph) {
    graphPage = new GraphPage($("graph-page"), graph, graphApp);
    const again = focusedId && focusedId.startsWith("graph-") ? document.getElementById(focusedId) : null;
    if (again) again.focus();
    else window.scrollTo(0, 0);
  } else {
    if (catalog.loaded) renderZones();
    readRowHeight();
    refilter();
    const el = $("rows").querySelector(`[data-index="${view.focus}"]`);
    if (el && document.activeElement === document.body) el.focus({ preventScroll: false });
  }
}

class ClusterPage {
  constructor(zone, cluster) {
    this.zone = zone;
    this.cluster = cluster;
    /** instance -> {samples: [{t, m}], el} */
    this.instances = new Map();
    this.closed = false;
    this.root = h("section", { class: "cluster", dataset: { testid: "cluster-view", cluster, zone, status: "" } });
    this.calls = new ClusterCalls(zone, cluster, graphApp);
    this.history = new ClusterHistory(zone, cluster, catalog);
    this.sync = new ClusterSync(zone, cluster, catalog, () => this.paintSync());
    zoneControls.prefer(zone, true);
    $("cluster-page").replaceChildren(this.root);
    this.render();
    this.loop();
    this.ticker = setInterval(() => this.tick(), 1000);
  }

  close() {
    this.closed = true;
    clearInterval(this.ticker);
    this.calls.close();
    this.history.close();
    this.sync.close();
    zoneControls.prefer(this.zone, false);
  }

  record() {
    return catalog.clusters.get(clusterKey(this.zone, this.cluster));
  }

  /** Redraws metadata and instances from the catalog; metrics stay in place. */
  render() {
    const c = this.record();
    this.root.dataset.status = c ? c.status : "";
    const back = h("a", { href: "#/", class: "back" }, "\u2190 All clusters");
    if (!c) {
      const loading = catalog.mode === "connecting";
      // A cluster only declared by its callers is no record, but it has callers.
      this.root.replaceChildren(back, h("h1", {}, this.cluster),
        h("p", { class: "muted" }, loading ? "Loading\u2026" : `No cluster ${this.cluster} registered in zone ${this.zone}.`),
        loading ? null : this.calls.el);
      this.skeleton = false;
      this.instances.clear();
      return;
    }
    if (!this.skeleton) this.build();
    this.title.replaceChildren(h("h1", {}, c.name && c.name !== c.clusterName ? `${c.name} (${c.clusterName})` : c.clusterName), badge(c.status), this.history.badge);
    this.meta.replaceChildren(...metaRows(c));
    this.renderInstances(c);
  }

  build() {
    this.skeleton = true;
    this.title = h("div", { class: "title" });
    this.meta = h("dl", { class: "meta" });
    this.instList = h("div", { class: "instances" });
    this.instNote = h("p", { class: "muted" });
    this.diag = h("div");
    this.root.replaceChildren(
      h("a", { href: "#/", class: "back" }, "\u2190 All clusters"),
      this.title,
      h("p", { class: "muted zone-line" }, `Zone ${this.zone} \u00b7 control server `,
        zoneControls.element(this.zone), " ", zoneControls.detail(this.zone)),
      h("section", { class: "card", "aria-labelledby": "meta-h" }, h("h2", { id: "meta-h" }, "Metadata"), this.meta),
      this.history.el,
      this.calls.el,
      h("section", { class: "card", "aria-labelledby": "inst-h" }, h("h2", { id: "inst-h" }, "Instances"), this.instNote, this.instList, this.clusterLevel()),
      h("section", { class: "card", "aria-labelledby": "diag-h" }, h("h2", { id: "diag-h" }, "Diagnosis"), this.diagForm(), this.diag));
  }

  renderInstances(c) {
    const list = c.instances || [];
    const names = new Set(list.map((i) => i.name));
    for (const [n, st] of this.instances) if (!names.has(n)) { st.el.remove(); this.instances.delete(n); }
    if (c.authorized === false) {
      this.instNote.replaceChildren("Instances are hidden without the read token. ",
        h("button", { type: "button", on: { click: () => askToken() } }, "Enter token"));
    } else {
      this.instNote.textContent = list.length ? `${list.length} live instance${list.length > 1 ? "s" : ""}.` : "No live instance.";
    }
    for (const i of list) {
      const source = i.source === "control-server" ? "control-server" : "agent";
      let st = this.instances.get(i.name);
      if (st && st.source !== source) { st.el.remove(); this.instances.delete(i.name); st = null; }
      if (!st) {
        st = { samples: [], startTime: i.startTime, source };
        st.age = h("span");
        st.started = h("span");
        const head = h("div", { class: "inst-head" }, h("h3", { class: "inst-name" }, i.name));
        const from = h("p", { class: "inst-source" }, "Source: ",
          h("span", { class: "tag", dataset: { testid: "instance-source", instance: i.name, source } },
            source === "agent" ? "agent" : "control server"));
        if (source === "agent") {
          st.sync = h("span", { class: "badge off", dataset: { testid: "instance-sync", instance: i.name, state: "" } });
          st.syncDetail = h("p", { class: "sync-detail", hidden: true });
          head.append(h("span", {}, "sync ", st.sync));
          this.sync.fill(i.name, st.sync, st.syncDetail);
        }
        head.append(h("span", {}, "started ", st.started), h("span", {}, "age ", st.age));
        st.identity = h("div", { class: "inst-id" });
        if (source === "agent") {
          st.metrics = h("div", { dataset: { testid: "instance-metrics", instance: i.name } }, h("p", { class: "muted" }, "Reading metrics\u2026"));
          st.level = this.levelControl(i.name);
          st.el = h("article", { class: "card", dataset: { testid: "instance-row", instance: i.name } },
            head, from, st.identity, st.syncDetail, st.metrics, st.level);
        } else {
          // No agent reports it: an endpoint the control server lists, with no
          // sidecar of meshcat's to read metrics, a sync state or a level from.
          st.el = h("article", { class: "card", dataset: { testid: "instance-row", instance: i.name } },
            head, from, h("p", { class: "muted" }, "An endpoint of the zone's control server: no agent reports it, so it has no metrics, sync state or log level here."));
        }
        this.instances.set(i.name, st);
        // Shows the sidecar's level now rather than the first choice of the list.
        if (c.authorized !== false && st.level) st.level.readLevel(false);
      }
      st.startTime = i.startTime;
      if (st.identity) st.identity.replaceChildren(...[identityLine(i.name, i.identity)].filter(Boolean));
      st.started.textContent = fmtTime(i.startTime);
      st.age.textContent = fmtAge(Date.now() - i.startTime);
    }
    // Keep the DOM in name order.
    const ordered = list.map((i) => this.instances.get(i.name).el);
    if (ordered.some((el, k) => this.instList.children[k] !== el)) this.instList.replaceChildren(...ordered);
  }

  tick() {
    for (const st of this.instances.values()) st.age.textContent = fmtAge(Date.now() - st.startTime);
  }

  /** Shows each sidecar's sync state as ClusterSync holds it. */
  paintSync() {
    for (const [name, st] of this.instances) if (st.sync) this.sync.fill(name, st.sync, st.syncDetail);
  }

  /** Reads each instance's metrics every few seconds while the page is open. */
  async loop() {
    while (!this.closed) {
      const c = this.record();
      if (c && c.authorized !== false) {
        const sidecars = [...this.instances].filter(([, st]) => st.metrics).map(([n]) => n);
        await Promise.all(sidecars.slice(0, 50).map((n) => this.readMetrics(n)));
      }
      await sleep(METRICS_EVERY_MS);
    }
  }

  async readMetrics(name) {
    const st = this.instances.get(name);
    if (!st || !st.metrics) return;
    try {
      const { body } = await call(`/metrics/${enc(this.cluster)}/${enc(name)}?zoneName=${enc(this.zone)}`);
      st.samples.push({ t: Date.now(), m: body });
      if (st.samples.length > HISTORY) st.samples.shift();
      st.metrics.replaceChildren(...metricsView(st.samples));
      st.metrics.dataset.requests = String(body["Total/requests"] ?? 0);
    } catch (e) {
      if (e.status === 404) return; // gone between the list and the read
      st.metrics.replaceChildren(h("p", { class: "error" }, e.message));
    }
  }

  levelControl(instance) {
    const id = `lvl-${instance}`.replace(/[^A-Za-z0-9_-]/g, "_");
    const select = h("select", { id }, ...LEVELS.map((l) => h("option", { value: l }, l)));
    const out = h("span", { class: "muted", "aria-live": "polite" });
    const base = `/zones/${enc(this.zone)}/clusters/${enc(this.cluster)}/instances/${enc(instance)}/logging`;
    const readLevel = async (ask) => {
      try {
        const get = () => call(base, { text: true });
        const { body } = await (ask ? withToken(get, "Reading the level needs the read token.") : get());
        const lvl = body.trim();
        if (LEVELS.includes(lvl)) select.value = lvl;
        out.textContent = `Sidecar log level: ${lvl}`;
      } catch (e) { out.textContent = e.message; }
    };
    const read = h("button", { type: "button", on: { click: () => readLevel(true) } }, "Read level");
    const set = h("button", { type: "button", class: "primary", on: { click: async () => {
      try {
        const { body } = await withToken(() => call(`${base}?level=${enc(select.value)}`, { method: "PUT", text: true }),
          "Setting the level needs the write token.");
        out.textContent = `Sidecar log level now ${body.trim()}`;
      } catch (e) { out.textContent = e.message; }
    } } }, "Set level");
    const el = h("div", { class: "level" },
      h("label", { class: "field", for: id }, h("span", {}, "Sidecar log level"), select), set, read, out);
    el.readLevel = readLevel;
    return el;
  }

  clusterLevel() {
    const select = h("select", { id: "cluster-level" }, ...LEVELS.map((l) => h("option", { value: l }, l)));
    select.value = "info";
    const out = h("span", { class: "muted", "aria-live": "polite" });
    const set = h("button", { type: "button", on: { click: async () => {
      try {
        const { body } = await withToken(() => call(
          `/zones/${enc(this.zone)}/clusters/${enc(this.cluster)}/logging?level=${enc(select.value)}`, { method: "PUT" }),
        "Setting the level needs the write token.");
        out.textContent = `${body.succeeded} instance(s) set, ${body.failed} failed.`;
      } catch (e) { out.textContent = e.message; }
    } } }, "Set on every instance");
    return h("div", { class: "level" },
      h("label", { class: "field", for: "cluster-level" }, h("span", {}, "Log level of every sidecar"), select), set, out);
  }

  diagForm() {
    const symptom = h("select", { id: "diag-symptom" }, ...SYMPTOMS.map(([v, l]) => h("option", { value: v }, l)));
    const path = h("input", { id: "diag-path", type: "text", placeholder: "/api/orders", autocomplete: "off" });
    const debug = h("input", { id: "diag-debug", type: "number", min: "0", max: "300", placeholder: "0", inputmode: "numeric" });
    const run = h("button", { type: "submit", class: "primary", dataset: { testid: "diagnose-button" } }, "Run diagnosis");
    const form = h("form", { class: "diag-form", on: { submit: async (e) => {
      e.preventDefault();
      run.disabled = true;
      this.diag.replaceChildren(h("p", { class: "muted", role: "status" }, "Running the playbook against the sidecars\u2026"));
      const q = new URLSearchParams({ zoneName: this.zone });
      if (symptom.value) q.set("symptom", symptom.value);
      if (path.value.trim()) q.set("path", path.value.trim());
      const secs = parseInt(debug.value, 10);
      if (secs > 0) q.set("debugSeconds", String(secs));
      try {
        const { body } = await withToken(() => call(`/diagnose/${enc(this.cluster)}?${q}`), "The diagnosis needs a token.");
        if (!this.closed) this.diag.replaceChildren(...diagnosisView(body));
      } catch (e) {
        this.diag.replaceChildren(h("p", { class: "error", role: "alert" }, e.message));
      } finally {
        run.disabled = false;
      }
    } } },
    h("label", { class: "field", for: "diag-symptom" }, h("span", {}, "Symptom"), symptom),
    h("label", { class: "field", for: "diag-path" }, h("span", {}, "Request path (optional)"), path),
    h("label", { class: "field", for: "diag-debug" }, h("span", {}, "Debug window, seconds (write token)"), debug),
    run);
    return form;
  }
}

function metaRows(c) {
  const rows = [
    ["Name", c.name], ["Version", c.version],
    ["Owner", c.ownerURL && safeHref(c.ownerURL) ? h("a", { href: safeHref(c.ownerURL), rel: "noopener noreferrer", target: "_blank" }, c.owner || c.ownerURL) : c.owner],
    ["Capability", c.capability], ["Business impact", c.businessImpact], ["Runtime", c.runtime],
    ["Description", c.description], ["Documentation", linkOrText(c.documentation)],
    ["API endpoint", linkOrText(c.apiEndpoint)], ["API specification", linkOrText(c.apiSpecEndpoint)],
    ["Protocols", (c.protocols || []).join(", ")],
    ["Instances wanted", `${c.minInstances ?? 0} to ${c.maxInstances ? c.maxInstances : "any"}`],
    ["Prometheus job", c.prometheusJob], ["Metrics port", c.metricsPort || ""],
    ["Control server", controlPlaneView(c.controlPlane)],
  ];
  const links = (c.externalLinks || []).filter((l) => safeHref(l.link));
  if (links.length) {
    rows.push(["Links", h("span", {}, ...links.flatMap((l, i) => [i ? ", " : "",
      h("a", { href: safeHref(l.link), rel: "noopener noreferrer", target: "_blank" }, l.name || l.link)]))]);
  }
  return rows.flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v === undefined || v === null || v === "" ? "\u2014" : v)]);
}

/** What the zone's control server declares of the cluster: `controlPlane`. */
function controlPlaneView(cp) {
  if (!cp) return null;
  const n = cp.endpoints ?? 0;
  const healthy = cp.healthyEndpoints ?? 0;
  return h("span", {
    dataset: { testid: "control-plane", declared: cp.declared ? "true" : "false", endpoints: String(n), healthyEndpoints: String(healthy) },
  }, cp.declared
    ? `declares it: ${fmtInt(n)} endpoint${n === 1 ? "" : "s"}, ${fmtInt(healthy)} healthy`
    : "does not declare it");
}

/** Rates between the last two samples of a cumulative counter, per second. */
function rate(samples, key) {
  if (samples.length < 2) return NaN;
  const a = samples[samples.length - 2];
  const b = samples[samples.length - 1];
  const dt = (b.t - a.t) / 1000;
  const dv = (b.m[key] ?? 0) - (a.m[key] ?? 0);
  return dt > 0 && dv >= 0 ? dv / dt : NaN;
}

function metricsView(samples) {
  const m = samples[samples.length - 1].m;
  const req = m["Total/requests"] ?? 0;
  const err = m["all/errors.count"] ?? 0;
  const lat = (k) => m[`all/latency_ms.${k}`];
  const rps = samples.map((s, i) => (i ? rate(samples.slice(0, i + 1), "Total/requests") : NaN)).slice(1);
  const item = (label, value) => h("div", {}, h("dt", {}, label), h("dd", {}, value));
  return [
    h("dl", { class: "metrics" },
      item("Requests", fmtInt(req)),
      item("Error rate", req ? `${fmtNum((100 * err) / req, 2)} % (${fmtInt(err)})` : "\u2014"),
      item("Requests/s", fmtNum(rate(samples, "Total/requests"), 2)),
      item("Latency p50 / p90", `${fmtInt(lat("p50"))} / ${fmtInt(lat("p90"))} ms`),
      item("Latency p99 / p99.9", `${fmtInt(lat("p99"))} / ${fmtInt(lat("p9990"))} ms`),
      item("Latency avg / max", `${fmtNum(lat("avg"), 1)} / ${fmtInt(lat("max"))} ms`),
      item("Throughput in", `${fmtBytes(rate(samples, "all/in_throughput"))}/s (${fmtBytes(m["all/in_throughput"])})`),
      item("Throughput out", `${fmtBytes(rate(samples, "all/out_throughput"))}/s (${fmtBytes(m["all/out_throughput"])})`),
      item("Sidecar memory", fmtBytes(m["process/memory/used"])),
      h("div", {}, h("dt", {}, "Requests/s, recent"), h("dd", {}, chart(rps)))),
  ];
}

const SVG = "http://www.w3.org/2000/svg";
function chart(values) {
  const W = 120, H = 32;
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  svg.setAttribute("preserveAspectRatio", "none");
  svg.setAttribute("class", "chart");
  svg.setAttribute("role", "img");
  const finite = values.filter(Number.isFinite);
  svg.setAttribute("aria-label", finite.length
    ? `Requests per second over the last ${finite.length} readings, latest ${fmtNum(finite[finite.length - 1], 2)}`
    : "Requests per second: not enough readings yet");
  const base = document.createElementNS(SVG, "line");
  base.setAttribute("x1", "0"); base.setAttribute("x2", String(W));
  base.setAttribute("y1", String(H - 1)); base.setAttribute("y2", String(H - 1));
  svg.append(base);
  if (finite.length >= 2) {
    const max = Math.max(...finite, 1e-9);
    const step = W / (HISTORY - 2);
    const off = W - step * (values.length - 1);
    const pts = values.map((v, i) => (Number.isFinite(v)
      ? `${(off + i * step).toFixed(1)},${(H - 2 - (v / max) * (H - 4)).toFixed(1)}` : null)).filter(Boolean);
    const line = document.createElementNS(SVG, "polyline");
    line.setAttribute("points", pts.join(" "));
    svg.append(line);
  }
  return svg;
}

function diagnosisView(r) {
  const steps = (r.steps || []).map((s) => h("li", { dataset: { testid: "diagnose-step", step: s.name, verdict: s.verdict } },
    h("span", { class: "step-name" }, s.name),
    h("span", { class: `badge ${["pass", "fail", "skipped"].includes(s.verdict) ? s.verdict : "skipped"}` },
      h("span", { "aria-hidden": "true" }, VERDICT_ICON[s.verdict] || "?"), s.verdict),
    (s.evidence || []).length ? h("ul", { class: "evidence", "aria-label": `Evidence of ${s.name}` }, ...s.evidence.map((e) => h("li", {}, e))) : null,
    s.action ? h("p", {}, h("strong", {}, "Action: "), s.action) : null));
  return [
    h("p", { class: "muted" }, `Cluster ${r.cluster} in zone ${r.zone}`, r.symptom ? `, symptom ${r.symptom}` : ", every check"),
    h("ol", { class: "steps" }, ...steps),
    h("p", { class: "conclusion", dataset: { testid: "diagnose-conclusion" } }, h("strong", {}, "Conclusion: "), r.conclusion || "\u2014"),
    (r.recentChanges || []).length ? h("div", {},
      h("h3", {}, "Recent changes of the clusters followed"),
      h("ol", { class: "timeline" }, ...r.recentChanges.map((e) => entryItem(e, "diagnose-change")))) : null,
  ];
}

// ---------------------------------------------------------------- wiring

const catalog = new Catalog((what) => {
  if (what.has("clusters")) view.sortedDirty = true;
  if (what.has("clusters") && !$("overview").hidden) expiring.changed();
  if (what.has("summary") || what.has("clusters") || what.has("zones")) renderSummary();
  if (what.has("zones")) renderZones();
  if (what.has("clusters") || what.has("zones")) refilter();
  renderLive();
  if (page && (what.has("clusters") || what.has("zones"))) page.render();
  const graphZones = catalog.takeGraphZones();
  const syncProxies = catalog.takeSync();
  zoneControls.changed(what, syncProxies);
  if (page) page.sync.changed(what, syncProxies);
  if (what.has("history")) {
    const entries = catalog.takeHistory();
    if (page) page.history.add(entries);
  }
  if (page) page.calls.changed(what);
  if (graphPage) graphPage.changed(what, graphZones);
});
catalog.askToken = askToken;
const expiring = new ExpiringList(catalog);
$("clusters-h").parentElement.before(expiring.el);
const zoneControls = new ZoneControls(catalog);
/** A token change: read again so `authorized` and instances follow it. */
catalog.refresh = () => {
  const read = catalog.snapshot().catch(() => {});
  if (catalog.abort) catalog.abort.abort();
  // The views of live data read again once the records say what the token allows.
  read.then(() => {
    expiring.load();
    if (graphPage) graphPage.refresher.now();
    if (page) page.calls.refresher.now();
    if (page) page.history.load();
    zoneControls.now();
    if (page) page.sync.now();
  });
};

updateTokenButton();
readRowHeight();
window.addEventListener("hashchange", route);
route();
catalog.start();
