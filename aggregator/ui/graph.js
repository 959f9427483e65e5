// meshcat dashboard: the dependency graph (contract section 14) in the page. The
// graph view draws `GET /graph` (the whole mesh, one zone, or the clusters within a
// few hops of one) on a canvas (graph-draw.js, laid out by graph-layout.js) and
// carries the same data as a list, the accessible form with the test hooks; the
// cluster view's calls list its callers and callees (`GET /graph` around it, depth
// 1). Both read again, gathered, when the event stream says the graph or a cluster
// changed, and every few seconds for the figures (which move without events).

import { ApiError, call, enc } from "./live.js";
import { badge, fmtInt, fmtNum, h } from "./dom.js";
import { layout } from "./graph-layout.js";
import { GraphCanvas, NODE_STYLE, nodeWords, percent, severity } from "./graph-draw.js";

/** Figures (requests, error ratios) move without events: read them this often. */
const FIGURES_EVERY_MS = 15000;
/** Rows of the list built per task, so a big graph never blocks the page long. */
const ROWS_PER_TASK = 700;
/** A list longer than this starts closed. */
const OPEN_LIST_ROWS = 80;
/**
 * A table of the list form with more rows than this holds only those in sight
 * (10,000 nodes and 30,000 edges as 40,000 rows took 2.6 s to build and held the
 * page's main thread meanwhile).
 */
export const ALL_ROWS = 1000;
/** Rows built above and below those in sight of a windowed table. */
const OVERSCAN = 10;
export const DEPTHS = [1, 2, 3, 4, 5];

/** The hash of the graph view for a scope: {zone, cluster, depth}. */
export function graphHash({ zone, cluster, depth } = {}) {
  if (zone && cluster) return `#/graph/c/${enc(zone)}/${enc(cluster)}/${depth || 1}`;
  if (zone) return `#/graph/z/${enc(zone)}`;
  return "#/graph";
}

/** The scope a hash names, or null when it is no graph view. */
export function parseGraphHash(hash) {
  if (hash === "#/graph") return {};
  let m = hash.match(/^#\/graph\/z\/([^/]+)$/);
  if (m) return { zone: decodeURIComponent(m[1]) };
  m = hash.match(/^#\/graph\/c\/([^/]+)\/([^/]+)\/([1-5])$/);
  if (m) return { zone: decodeURIComponent(m[1]), cluster: decodeURIComponent(m[2]), depth: Number(m[3]) };
  return null;
}

function graphPath({ zone, cluster, depth }) {
  const q = new URLSearchParams();
  if (zone) q.set("zoneName", zone);
  if (zone && cluster) { q.set("clusterName", cluster); q.set("depth", String(depth || 1)); }
  const s = q.toString();
  return s ? `/graph?${s}` : "/graph";
}

function clusterHref(node) {
  return `#/c/${enc(node.zoneName)}/${enc(node.clusterName)}`;
}

/** Reads again after changes, gathered: at most one read in flight, one queued. */
export class Refresher {
  constructor(read) {
    this.read = read;
    this.timer = null;
    this.running = false;
    this.again = false;
    this.last = 0;
    this.minGap = 1000;
  }

  soon(delay = 400) {
    if (this.running) { this.again = true; return; }
    const wait = Math.max(delay, this.last + this.minGap - Date.now());
    if (this.timer && this.due <= Date.now() + wait) return;
    clearTimeout(this.timer);
    this.due = Date.now() + wait;
    this.timer = setTimeout(() => this.now(), wait);
  }

  async now() {
    clearTimeout(this.timer);
    this.timer = null;
    if (this.running) { this.again = true; return; }
    this.running = true;
    this.last = Date.now();
    try {
      await this.read();
    } finally {
      this.running = false;
      if (this.again) { this.again = false; this.soon(0); }
    }
  }

  /** Reads now, then every `everyMs` while the page is visible, until stop(). */
  poll(everyMs) {
    this.now();
    this.ticker = setInterval(() => { if (!document.hidden) this.soon(0); }, everyMs);
  }

  stop() {
    clearInterval(this.ticker);
    clearTimeout(this.timer);
    this.timer = null;
    this.read = async () => {};
  }
}

function edgeKey(e) {
  return `${e.source}\u0000${e.target}`;
}

function yesNo(v) {
  return v ? "true" : "false";
}

function edgeWords(e) {
  return [
    e.observed ? "traffic in the window" : "no traffic in the window",
    e.declared ? "declared" : "not declared",
  ].join(", ");
}

function latency(e) {
  const f = (v) => (Number.isFinite(v) ? `${fmtNum(v, 1)} ms` : "\u2014");
  return `${f(e.p50Ms)} / ${f(e.p99Ms)}`;
}

function statusCell(node) {
  return node.kind === "external" ? h("span", { class: "badge external" }, h("span", { "aria-hidden": "true" }, "\u2197"), "external") : badge(node.status);
}

/** The graph view: a canvas, its legend and controls, and the same data as a list. */
export class GraphPage {
  /**
   * `scope`: {zone, cluster, depth}; `app`: {withToken(fn, why), askToken(why),
   * zones() (sorted zone names), liveHidden() (the read token is missing), ready()
   * (settles once the catalog's records are first read: liveHidden() is known)}.
   */
  constructor(root, scope, app) {
    this.root = root;
    this.scope = scope;
    this.app = app;
    this.closed = false;
    this.raw = null;
    this.data = null;
    this.listGen = 0;
    this.selectedId = null;
    this.first = true;
    this.refresher = new Refresher(() => this.load());
    this.build();
    this.refresher.poll(FIGURES_EVERY_MS);
  }

  close() {
    this.closed = true;
    this.refresher.stop();
    this.canvas.destroy();
  }

  /** The catalog moved: `what` as Catalog emits it, `zones` the zones of graph events. */
  changed(what, zones) {
    if (what.has("zones")) this.fillZones();
    const { zone, cluster } = this.scope;
    const mine = !zone || cluster || zones.has(zone);
    if (what.has("graph") && mine) this.refresher.soon(300);
    else if (what.has("clusters")) this.refresher.soon(1000);
  }

  build() {
    const { zone, cluster, depth } = this.scope;
    this.zoneSelect = h("select", { id: "graph-zone", on: { change: (e) => {
      location.hash = graphHash({ zone: e.target.value });
    } } });
    const controls = [
      h("label", { class: "field", for: "graph-zone" }, h("span", {}, "Zone"), this.zoneSelect),
    ];
    if (cluster) {
      const sel = h("select", { id: "graph-depth", on: { change: (e) => {
        location.hash = graphHash({ zone, cluster, depth: Number(e.target.value) });
      } } }, ...DEPTHS.map((d) => h("option", { value: String(d) }, `${d} hop${d > 1 ? "s" : ""}`)));
      sel.value = String(depth);
      controls.push(h("label", { class: "field", for: "graph-depth" }, h("span", {}, "Depth"), sel));
    }
    this.find = h("input", { id: "graph-find", type: "search", placeholder: "Cluster name", autocomplete: "off", spellcheck: "false" });
    const findForm = h("form", { class: "graph-find", on: { submit: (e) => { e.preventDefault(); this.findNode(this.find.value); } } },
      h("label", { class: "field", for: "graph-find" }, h("span", {}, "Find a node"), this.find),
      h("button", { type: "submit" }, "Find"));
    const zoomButtons = h("div", { class: "graph-zoom", role: "group", "aria-label": "Zoom" },
      h("button", { type: "button", "aria-label": "Zoom in", on: { click: () => this.canvas.zoom(1.4) } }, "+"),
      h("button", { type: "button", "aria-label": "Zoom out", on: { click: () => this.canvas.zoom(1 / 1.4) } }, "\u2212"),
      h("button", { type: "button", on: { click: () => this.canvas.fit() } }, "Fit"));
    const el = h("canvas", {
      id: "graph-canvas", class: "graph-canvas", tabindex: "0", role: "img",
      "aria-label": "Dependency graph. Drag or use the arrow keys to pan, the wheel or + and - to zoom, 0 to fit. The list below holds the same nodes and edges.",
    });
    this.tip = h("div", { class: "graph-tip", role: "tooltip", hidden: true });
    this.empty = h("p", { class: "graph-empty muted", hidden: true });
    this.status = h("p", { class: "muted graph-status", "aria-live": "polite" }, "Reading the graph\u2026");
    this.info = h("p", { class: "graph-info", "aria-live": "polite" });
    this.legend = legend(undefined);
    this.legendWarning = undefined;
    this.nodeTable = new ListTable("graph-nodes-h", ["Node", "Zone", "Status", "Instances", "Owner"], {
      key: (n) => n.id,
      sig: (n) => `${n.status}|${n.kind}|${n.registered}|${n.instances}|${n.owner}`,
      row: nodeRow,
    });
    this.edgeTable = new ListTable("graph-edges-h", ["Caller", "Called", "Error ratio", "Requests/s", "Latency p50 / p99", "Traffic", "Declared"], {
      key: edgeKey,
      sig: (e, warning) => `${e.errorRatio}|${e.errors}|${e.requests}|${e.rps}|${e.p50Ms}|${e.p99Ms}|${e.observed}|${e.declared}|${warning}`,
      row: edgeRow,
    });
    this.listSummary = h("summary", {}, "Nodes and edges as a list");
    this.list = h("details", { class: "graph-list", on: { toggle: () => { this.nodeTable.render(); this.edgeTable.render(); } } },
      this.listSummary,
      h("h3", { id: "graph-nodes-h" }, "Nodes"), this.nodeTable.el,
      h("h3", { id: "graph-edges-h" }, "Edges"), this.edgeTable.el);
    const title = cluster
      ? h("h1", {}, `Around ${cluster}`, h("span", { class: "muted sub" }, ` zone ${zone}, ${depth} hop${depth > 1 ? "s" : ""}`))
      : h("h1", {}, zone ? `Dependency graph of zone ${zone}` : "Dependency graph");
    this.section = h("section", { class: "graph", dataset: { testid: "graph" }, "aria-labelledby": "graph-h" },
      h("div", { class: "graph-head", id: "graph-h" }, title,
        cluster ? h("span", { class: "graph-links" },
          h("a", { href: `#/c/${enc(zone)}/${enc(cluster)}` }, `Open ${cluster}`), " \u00b7 ",
          h("a", { href: graphHash({ zone }) }, `Zone ${zone}`), " \u00b7 ",
          h("a", { href: graphHash() }, "Whole mesh")) : null),
      h("div", { class: "filters graph-controls" }, ...controls, findForm, zoomButtons),
      this.status,
      h("div", { class: "graph-stage" }, el, this.tip, this.empty),
      this.info,
      this.legend,
      this.list);
    this.root.replaceChildren(this.section);
    this.fillZones();
    this.canvas = new GraphCanvas(el, {
      open: (node) => { if (node.kind === "cluster") location.hash = clusterHref(node); },
      select: (hit) => this.select(hit),
      hover: (hit, x, y) => this.hover(hit, x, y),
    });
  }

  fillZones() {
    const names = this.app.zones();
    const want = this.scope.zone || "";
    if (want && !names.includes(want)) names.push(want);
    this.zoneSelect.replaceChildren(h("option", { value: "" }, "All zones"), ...names.map((z) => h("option", { value: z }, z)));
    this.zoneSelect.value = want;
  }

  async load() {
    await this.app.ready();
    if (this.closed) return;
    const why = "The graph is live data: it needs the read token.";
    // Known to lack the read token: ask (once per view) rather than call for a 403.
    // A token just given is not the one the records were read with: no more hidden.
    if (this.app.liveHidden()) {
      const ask = !this.asked;
      this.asked = true;
      if (!ask || !(await this.app.askToken(why))) {
        this.fail(new ApiError(403, "forbidden", why));
        return;
      }
    }
    let res;
    try {
      res = await this.app.withToken(() => call(graphPath(this.scope)), why);
    } catch (e) {
      if (this.closed) return;
      this.fail(e);
      return;
    }
    if (this.closed || res.raw === this.raw) {
      this.stamp();
      return;
    }
    this.raw = res.raw;
    this.show(res.body);
  }

  fail(e) {
    const again = h("button", { type: "button", on: { click: () => this.refresher.now() } }, "Try again");
    if (e instanceof ApiError && e.needsToken) {
      this.status.replaceChildren(h("span", { class: "error" }, e.message), " ",
        h("button", { type: "button", on: { click: async () => { if (await this.app.askToken(e.message)) this.refresher.now(); } } }, "Enter token"));
    } else if (e instanceof ApiError && e.status === 404) {
      this.status.replaceChildren(h("span", { class: "error" }, e.message), " ", h("a", { href: graphHash() }, "Show the whole mesh"));
    } else {
      this.status.replaceChildren(h("span", { class: "error" }, `The graph could not be read: ${e.message}`), " ", again);
    }
  }

  show(g) {
    const nodes = g.nodes || [];
    const index = new Map(nodes.map((n, i) => [n.id, i]));
    // The canvas draws the edges whose two ends it has (all of them, from the API),
    // each given its ends' positions in `nodes` (not copied: 30,000 edges).
    const drawn = [];
    for (const e of g.edges || []) {
      const s = index.get(e.source), t = index.get(e.target);
      if (s !== undefined && t !== undefined) { e.s = s; e.t = t; drawn.push(e); }
    }
    const focusId = this.scope.cluster ? `${this.scope.zone}/${this.scope.cluster}` : null;
    const focus = focusId !== null && index.has(focusId) ? index.get(focusId) : -1;
    const t0 = performance.now();
    const box = this.canvas.canvas.getBoundingClientRect();
    const placed = layout(nodes, drawn, focus, box.height > 0 ? box.width / box.height : 2);
    this.layoutMs = performance.now() - t0;
    this.data = g;
    // The view is kept across refreshes once it showed something; an empty graph's
    // view (a 1 x 1 box) is fitted again when nodes come.
    const keepView = !this.first && this.shownNodes > 0;
    this.shownNodes = nodes.length;
    const warning = g.errorRatioWarning;
    if (warning !== this.legendWarning) {
      this.legendWarning = warning;
      const fresh = legend(warning);
      this.legend.replaceWith(fresh);
      this.legend = fresh;
    }
    this.canvas.setData({ nodes, edges: drawn, x: placed.x, y: placed.y, blocks: placed.blocks, bounds: placed, focus, warning }, keepView, this.first);
    if (this.selectedId !== null) {
      const i = index.get(this.selectedId);
      this.canvas.setSelected(i === undefined ? null : { node: i });
    }
    this.first = false;
    this.empty.hidden = nodes.length > 0;
    this.empty.textContent = this.scope.zone
      ? "No cluster in this zone yet, and no call that reaches it."
      : "No cluster registered yet: nodes appear as clusters register, edges as sidecars report traffic or owners declare dependencies.";
    this.stamp();
    // The list after the first frame, so the picture comes first.
    const gen = ++this.listGen;
    requestAnimationFrame(() => setTimeout(() => this.fillList(g, gen), 0));
  }

  stamp() {
    const g = this.data;
    if (!g) return;
    const n = g.nodes.length, m = g.edges.length;
    const failing = g.edges.filter((e) => e.observed && severity(e.errorRatio, g.errorRatioWarning) === "bad").length;
    // Declared and quiet; a predicted SAN mismatch (neither observed nor declared)
    // is counted with the mismatches.
    const idle = g.edges.filter((e) => !e.observed && e.declared).length;
    const undeclared = g.edges.filter((e) => e.observed && !e.declared).length;
    const mismatched = g.edges.filter((e) => e.tlsIdentity && !e.tlsIdentity.match).length;
    this.status.replaceChildren(
      `${fmtInt(n)} node${n === 1 ? "" : "s"}, ${fmtInt(m)} edge${m === 1 ? "" : "s"}`,
      failing ? ` \u00b7 ${fmtInt(failing)} failing (> ${percent(g.errorRatioWarning)} errors)` : "",
      undeclared ? ` \u00b7 ${fmtInt(undeclared)} undeclared` : "",
      mismatched ? ` \u00b7 ${fmtInt(mismatched)} SAN mismatch${mismatched === 1 ? "" : "es"}` : "",
      idle ? ` \u00b7 ${fmtInt(idle)} declared without traffic` : "",
      ` \u00b7 traffic over the last ${g.windowSeconds} s \u00b7 read ${new Date().toLocaleTimeString()}`);
  }

  /**
   * Fills the list's two tables (ListTable: every row, in tasks of a few hundred,
   * or the rows in sight of a long one). The counts of `[data-testid=graph]` are set
   * once both hold the answer, so they always describe what the list holds.
   */
  async fillList(g, gen) {
    let work = 0;
    const pause = async () => {
      if (++work % ROWS_PER_TASK) return true;
      await new Promise((r) => setTimeout(r, 0));
      return gen === this.listGen && !this.closed;
    };
    const warning = g.errorRatioWarning;
    if (!(await this.nodeTable.fill(g.nodes, warning, pause))) return;
    if (!(await this.edgeTable.fill(g.edges, warning, pause))) return;
    const n = g.nodes.length, m = g.edges.length;
    this.listSummary.textContent = `Nodes and edges as a list (${fmtInt(n)} nodes, ${fmtInt(m)} edges)`;
    if (this.listOpenedOnce === undefined) {
      this.listOpenedOnce = true;
      this.list.open = n + m <= OPEN_LIST_ROWS;
    }
    Object.assign(this.section.dataset, { nodes: String(n), edges: String(m) });
  }

  findNode(text) {
    const t = text.trim().toLowerCase();
    if (!t || !this.data) return;
    const nodes = this.data.nodes;
    const hit = nodes.find((n) => n.clusterName.toLowerCase() === t) ||
      nodes.find((n) => n.id.toLowerCase() === t) ||
      nodes.find((n) => n.clusterName.toLowerCase().includes(t));
    if (!hit) { this.info.textContent = `No node named like \u201c${text.trim()}\u201d in this view.`; return; }
    const i = this.canvas.center(hit.id);
    this.select({ node: i });
    this.canvas.setSelected({ node: i });
  }

  select(hit) {
    if (!hit || !this.data) { this.selectedId = null; this.info.replaceChildren(); return; }
    if (hit.node !== undefined) {
      const n = this.canvas.model.nodes[hit.node];
      this.selectedId = n.id;
      this.info.replaceChildren(...nodeDescription(n),
        n.kind === "cluster" ? [" ", h("a", { href: clusterHref(n) }, `Open ${n.clusterName}`), " \u00b7 ",
          h("a", { href: graphHash({ zone: n.zoneName, cluster: n.clusterName, depth: 1 }) }, "Graph around it")] : []);
    } else {
      this.selectedId = null;
      this.info.replaceChildren(...edgeDescription(this.canvas.model.edges[hit.edge]));
    }
  }

  hover(hit, cx, cy) {
    if (!hit || !this.canvas.model) { this.tip.hidden = true; return; }
    const m = this.canvas.model;
    const lines = hit.node !== undefined ? nodeDescription(m.nodes[hit.node]) : edgeDescription(m.edges[hit.edge]);
    this.tip.replaceChildren(...lines);
    this.tip.hidden = false;
    const stage = this.tip.parentElement.getBoundingClientRect();
    const tw = this.tip.offsetWidth, th = this.tip.offsetHeight;
    let x = cx - stage.left + 14, y = cy - stage.top + 14;
    if (x + tw > stage.width) x = Math.max(0, cx - stage.left - tw - 14);
    if (y + th > stage.height) y = Math.max(0, cy - stage.top - th - 14);
    this.tip.style.transform = `translate(${Math.round(x)}px, ${Math.round(y)}px)`;
  }
}

/**
 * One table of the list form, in its scroll box. Up to ALL_ROWS rows, every row is
 * in the DOM, built in tasks and keyed (a refresh rebuilds only the rows whose
 * figures changed). A longer table is windowed: it holds the rows in sight of its
 * scroll box and OVERSCAN more each way, between two spacer rows that give the box
 * the height of every row, so the scroll bar, the keyboard and `aria-rowcount` /
 * `aria-rowindex` still speak of all of them; scrolling builds the rows that come
 * into sight. Rows are one line (cells do not wrap), so they all have the height of
 * the first one drawn.
 */
class ListTable {
  /** `kind`: {key(item), sig(item, warning), row(item, warning)}. */
  constructor(labelledBy, columns, kind) {
    this.kind = kind;
    this.columns = columns.length;
    this.items = [];
    this.warning = undefined;
    this.rows = new Map();
    this.windowed = false;
    this.rowH = 33;
    this.body = h("tbody");
    this.table = h("table", { class: "data", "aria-labelledby": labelledBy },
      h("thead", {}, h("tr", {}, ...columns.map((t) => h("th", { scope: "col" }, t)))), this.body);
    this.el = h("div", { class: "table-scroll" }, this.table);
    this.queued = false;
    this.el.addEventListener("scroll", () => {
      if (!this.windowed || this.queued) return;
      this.queued = true;
      requestAnimationFrame(() => { this.queued = false; this.render(); });
    });
  }

  /** Shows `items`; answers false when `pause` says to stop (a newer answer came). */
  async fill(items, warning, pause) {
    const { key, sig, row } = this.kind;
    this.items = items;
    this.warning = warning;
    this.windowed = items.length > ALL_ROWS;
    this.table.classList.toggle("windowed", this.windowed);
    if (this.windowed) {
      this.table.setAttribute("aria-rowcount", String(items.length + 1));
      this.render();
      return true;
    }
    this.table.removeAttribute("aria-rowcount");
    const next = new Map();
    const els = [];
    for (const item of items) {
      const k = key(item), s = sig(item, warning);
      let r = this.rows.get(k);
      if (!r || r.sig !== s) r = { sig: s, el: row(item, warning) };
      next.set(k, r);
      els.push(r.el);
      if (!(await pause())) return false;
    }
    this.rows = next;
    this.body.replaceChildren(...els);
    return true;
  }

  /** A windowed table: builds the rows in sight, between its two spacers. */
  render(measured = false) {
    if (!this.windowed) return;
    const { key, sig, row } = this.kind;
    const { items, warning } = this;
    const top = Math.max(0, this.el.scrollTop - this.table.tHead.offsetHeight);
    const first = Math.max(0, Math.floor(top / this.rowH) - OVERSCAN);
    const last = Math.min(items.length, Math.ceil((top + this.el.clientHeight) / this.rowH) + OVERSCAN);
    const next = new Map();
    const els = [];
    for (let i = first; i < last; i++) {
      const item = items[i];
      const k = key(item), s = sig(item, warning);
      let r = this.rows.get(k);
      if (!r || r.sig !== s) r = { sig: s, el: row(item, warning) };
      r.el.setAttribute("aria-rowindex", String(i + 2));
      next.set(k, r);
      els.push(r.el);
    }
    this.rows = next;
    this.body.replaceChildren(this.spacer(first * this.rowH), ...els, this.spacer((items.length - last) * this.rowH));
    // Rows are one line: the first one drawn tells their height (0 while closed).
    const drawn = els.length ? els[0].getBoundingClientRect().height : 0;
    if (drawn > 0 && Math.abs(drawn - this.rowH) > 0.5 && !measured) {
      this.rowH = drawn;
      this.render(true);
    }
  }

  spacer(height) {
    const td = h("td", { colspan: String(this.columns) });
    const tr = h("tr", { class: "spacer-row", "aria-hidden": "true" }, td);
    td.style.height = `${height}px`;
    return tr;
  }
}

function nodeDescription(n) {
  const words = nodeWords(n);
  return [h("strong", {}, n.kind === "external" ? `${n.clusterName} (external, called from zone ${n.zoneName})` : `${n.clusterName}`),
    n.kind === "external" ? "" : ` zone ${n.zoneName}`, ` \u00b7 ${words}`,
    n.owner ? ` \u00b7 owner ${n.owner}` : "", n.drifted ? " \u00b7 configuration drifted" : ""];
}

function edgeDescription(e) {
  return [h("strong", {}, `${e.source} \u2192 ${e.target}`), " \u00b7 ",
    e.observed ? `${percent(e.errorRatio)} errors (${fmtInt(e.errors)} of ${fmtInt(e.requests)} requests), ${fmtNum(e.rps, 2)} requests/s, latency p50 / p99 ${latency(e)}${e.tls ? ", TLS" : ""}` : "no traffic in the window",
    " \u00b7 ", e.declared ? "declared" : "not declared",
    e.tlsIdentity && !e.tlsIdentity.match
      ? [" \u00b7 ", h("strong", {}, "SAN mismatch"), `: expects ${e.tlsIdentity.expectedSans.join(", ")}; presented ${e.tlsIdentity.presentedSans.join(", ") || "none"}`]
      : ""].flat();
}

function nodeRow(n) {
  const dataset = { testid: "graph-node", id: n.id };
  // An external node's status is null: the attribute is absent, as the value is.
  if (n.status !== null && n.status !== undefined) dataset.status = n.status;
  return h("tr", { dataset },
    h("th", { scope: "row" }, n.kind === "cluster" ? h("a", { href: clusterHref(n) }, n.clusterName) : `${n.clusterName} (external)`,
      n.kind === "cluster" && !n.registered ? h("span", { class: "muted" }, " not registered") : null),
    h("td", {}, n.zoneName),
    h("td", {}, statusCell(n)),
    h("td", { class: "num" }, n.kind === "external" ? "\u2014" : String(n.instances)),
    h("td", {}, n.owner || "\u2014"));
}

function edgeRow(e, warning) {
  const sev = e.observed ? severity(e.errorRatio, warning) : "ok";
  return h("tr", {
    dataset: {
      testid: "graph-edge", source: e.source, target: e.target, errorRatio: String(e.errorRatio),
      observed: yesNo(e.observed), declared: yesNo(e.declared),
      tlsMatch: e.tlsIdentity ? yesNo(e.tlsIdentity.match) : "",
    },
  },
  h("td", {}, e.source), h("td", {}, e.target),
  h("td", { class: `num ratio-${sev}` }, e.observed ? `${percent(e.errorRatio)} (${fmtInt(e.errors)} of ${fmtInt(e.requests)})` : "\u2014"),
  h("td", { class: "num" }, e.observed ? fmtNum(e.rps, 2) : "\u2014"),
  h("td", { class: "num" }, latency(e)),
  h("td", {}, e.observed ? "observed" : h("span", { class: "tag idle" }, "no traffic"),
    e.tlsIdentity && !e.tlsIdentity.match ? h("span", {
      class: "tag mismatch",
      title: `expects ${e.tlsIdentity.expectedSans.join(", ")}; presented ${e.tlsIdentity.presentedSans.join(", ")}`,
    }, "SAN mismatch") : null),
  h("td", {}, e.declared ? "declared" : h("span", { class: "tag undeclared" }, "undeclared")));
}

/** The legend; the edges' words name the aggregator's error-ratio warning once known. */
function legend(warning) {
  const above = Number.isFinite(warning) ? percent(warning) : "the warning ratio";
  const swatch = (style, shape) => h("span", { class: `swatch ${shape}`, "aria-hidden": "true", dataset: { fill: style } });
  const node = (key, word) => h("li", {}, swatch(key, key === "external" ? "square" : "dot"),
    h("span", { "aria-hidden": "true", class: "glyph" }, NODE_STYLE[key].icon), word);
  const line = (cls, word) => h("li", {}, h("span", { class: `line ${cls}`, "aria-hidden": "true" }), word);
  return h("div", { class: "legend", role: "group", "aria-label": "Legend" },
    h("ul", { "aria-label": "Nodes" },
      node("stable", "stable"), node("warning", "warning"), node("down", "down"), node("external", "external service"),
      h("li", {}, h("span", { class: "swatch dot ring", "aria-hidden": "true" }), "dashed ring: declared by a caller, not registered")),
    h("ul", { "aria-label": "Edges" },
      line("ok", "calls, no errors"),
      line("warn", `errors at or below ${above} (wider)`),
      line("bad", `errors above ${above} (widest, ratio shown)`),
      line("idle", "dashed: declared, no traffic in the window"),
      h("li", {}, h("span", { class: "line ok with-diamond", "aria-hidden": "true" }), "diamond: traffic nobody declared"),
      h("li", {}, h("span", { class: "line ok with-square", "aria-hidden": "true" }), "square near the caller: a SAN it expects is not presented")));
}

/** The callers and callees of one cluster, for the cluster view. */
export class ClusterCalls {
  /** `app` as for GraphPage. */
  constructor(zone, cluster, app) {
    this.zone = zone;
    this.cluster = cluster;
    this.app = app;
    this.raw = null;
    this.closed = false;
    this.body = h("div", {}, h("p", { class: "muted" }, "Reading the calls\u2026"));
    const depth = h("select", { id: "calls-depth", on: { change: () => { link.href = graphHash({ zone, cluster, depth: Number(depth.value) }); } } },
      ...DEPTHS.map((d) => h("option", { value: String(d) }, `${d} hop${d > 1 ? "s" : ""}`)));
    depth.value = "2";
    const link = h("a", { class: "button", href: graphHash({ zone, cluster, depth: 2 }), dataset: { testid: "cluster-graph" } }, "Show in the graph");
    this.el = h("section", { class: "card", "aria-labelledby": "calls-h" },
      h("h2", { id: "calls-h" }, "Calls"),
      h("div", { class: "level" }, h("label", { class: "field", for: "calls-depth" }, h("span", {}, "Graph depth"), depth), link),
      this.body);
    this.refresher = new Refresher(() => this.load());
    this.refresher.poll(FIGURES_EVERY_MS);
  }

  close() {
    this.closed = true;
    this.refresher.stop();
  }

  changed(what) {
    if (what.has("graph")) this.refresher.soon(300);
    else if (what.has("clusters")) this.refresher.soon(1000);
  }

  async load() {
    let res;
    try {
      await this.app.ready();
      if (this.closed) return;
      // Known to lack the read token: say so rather than call for a 403.
      if (this.app.liveHidden()) throw new ApiError(403, "forbidden", "");
      res = await call(graphPath({ zone: this.zone, cluster: this.cluster, depth: 1 }));
    } catch (e) {
      if (this.closed) return;
      this.raw = null;
      if (e instanceof ApiError && e.needsToken) {
        const why = "Callers and callees are live data: they need the read token.";
        this.body.replaceChildren(h("p", { class: "muted" }, `${why} `,
          h("button", { type: "button", on: { click: async () => { if (await this.app.askToken(why)) this.refresher.now(); } } }, "Enter token")));
      } else if (e instanceof ApiError && e.status === 404) {
        this.body.replaceChildren(h("p", { class: "muted" }, "Nothing calls this cluster and it calls nothing (no traffic seen, no dependency declared)."));
      } else {
        this.body.replaceChildren(h("p", { class: "error" }, e.message));
      }
      return;
    }
    if (this.closed || res.raw === this.raw) return;
    this.raw = res.raw;
    this.render(res.body);
  }

  render(g) {
    const me = `${this.zone}/${this.cluster}`;
    const nodes = new Map(g.nodes.map((n) => [n.id, n]));
    const callers = g.edges.filter((e) => e.target === me && e.source !== me);
    const callees = g.edges.filter((e) => e.source === me && e.target !== me);
    const list = (edges, other, testid, title, none) => [
      h("h3", {}, `${title} (${edges.length})`),
      edges.length ? h("ul", { class: "calls" }, ...edges.map((e) => {
        const n = nodes.get(e[other]) || { id: e[other], kind: "external", clusterName: e[other], zoneName: "" };
        return h("li", { dataset: { testid, id: n.id, errorRatio: String(e.errorRatio), observed: yesNo(e.observed), declared: yesNo(e.declared) } },
          n.kind === "cluster" ? h("a", { href: clusterHref(n) }, n.zoneName === this.zone ? n.clusterName : n.id) : h("span", {}, `${n.clusterName} (external)`),
          " ", statusCell(n), " ",
          h("span", { class: `num ratio-${e.observed ? severity(e.errorRatio, g.errorRatioWarning) : "ok"}` }, e.observed
            ? `${percent(e.errorRatio)} errors, ${fmtInt(e.requests)} requests (${fmtNum(e.rps, 2)}/s), p99 ${Number.isFinite(e.p99Ms) ? `${fmtNum(e.p99Ms, 1)} ms` : "\u2014"}`
            : ""),
          " ", e.observed ? h("span", { class: "tag" }, "observed") : h("span", { class: "tag idle" }, "no traffic"),
          " ", e.declared ? h("span", { class: "tag" }, "declared") : h("span", { class: "tag undeclared" }, "undeclared"),
          e.tlsIdentity && !e.tlsIdentity.match ? h("span", {
            class: "tag mismatch",
            title: `expects ${e.tlsIdentity.expectedSans.join(", ")}; presented ${e.tlsIdentity.presentedSans.join(", ")}`,
          }, "SAN mismatch") : null);
      })) : h("p", { class: "muted" }, none),
    ];
    this.body.replaceChildren(
      h("p", { class: "muted" }, `Traffic over the last ${g.windowSeconds} s, and the declared dependencies.`),
      ...list(callers, "source", "cluster-caller", "Called by", "No caller seen or declared."),
      ...list(callees, "target", "cluster-callee", "Calls", "No call seen or declared."));
  }
}
