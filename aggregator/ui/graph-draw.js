// meshcat dashboard: the dependency graph on a <canvas>. One canvas instead of
// thousands of SVG elements: edges are stroked in one batched path per style (the
// style table EDGE_STYLES, keyed by each edge's state), nodes filled in one path per
// status, text drawn only where it is readable (zoomed in) and only for what is in
// sight. A view with thousands of edges or nodes in sight is drawn into pixels
// instead (graph-raster.js: one-pixel lines, stamped discs), which Chromium's
// software rasterizer would otherwise spend a second per frame on. A frame is drawn
// only when something asked for it (data, pan, zoom, hover, resize), never in a loop,
// and at most once per animation frame however many events came. Pan by dragging (or
// the arrow keys), zoom with the wheel (or + and -), 0 fits the graph; a click on a
// node calls `onOpen`.
//
// Colours pair with a shape or a glyph, never alone: stable ✔, warning ▲, down ✖,
// an external service is a square with ↗; an edge's error ratio is its colour, its
// width and, zoomed in, a label; a dashed edge carries no traffic (declared only), a
// diamond on an edge marks traffic nobody declared, a square near its caller's end a
// SAN the caller expects and the callee does not present (`tlsIdentity.match` false).

import { Raster, dashedRing, diamond, disc, framedSquare, pieces, rgba, square } from "./graph-raster.js";

/** Node radius, world units. */
export const RADIUS = 11;
const MIN_K = 0.02;
const MAX_K = 4;
/** Zoom from which labels, edge figures and second lines are drawn. */
const LABEL_K = 0.5;
const DETAIL_K = 0.85;
const ARROW_K = 0.3;
/**
 * More edges or nodes in sight than this and the frame is drawn into pixels
 * (graph-raster.js); fewer, with the canvas's anti-aliased paths. 1,000 nodes and
 * 3,000 edges stay under it.
 */
const PIXELS_EDGES = 4000;
const PIXELS_NODES = 2000;
/** Hit tests look in square cells of the world this wide (a spatial index). */
const CELL = 256;
/** An edge whose box spans more cells than this is checked on every hit test. */
const MAX_CELLS = 64;

const BACKGROUND = "#fbfcfe";
const BLOCK_FILL = "#f1f4f8";
const BLOCK_LINE = "#d5dbe3";
const INK = "#18202b";

export const NODE_STYLE = {
  stable: { fill: "#1c7c37", ink: "#ffffff", icon: "\u2714" },
  warning: { fill: "#e3a008", ink: "#3b2600", icon: "\u25B2" },
  down: { fill: "#c62828", ink: "#ffffff", icon: "\u2716" },
  external: { fill: "#55657a", ink: "#ffffff", icon: "\u2197" },
};

/**
 * How each state of an edge is drawn, in drawing order (later styles on top):
 * `colour`, `width` in CSS pixels (1: a hairline, which Chromium's software
 * rasterizer strokes several times faster than wider lines), `dash` ([on, off] CSS
 * pixels, or null for a solid line). An edge's state is `edgeState(edge, warning)`;
 * a new way to draw an edge is one entry here, one case there and a line in the
 * legend (graph.js), and both renderers take it.
 */
export const EDGE_STYLES = {
  idle: { colour: "#8a95a5", width: 1, dash: [6, 4] },
  ok: { colour: "#5d6f86", width: 1, dash: null },
  warn: { colour: "#c06a00", width: 2.4, dash: null },
  bad: { colour: "#c62828", width: 3.5, dash: null },
};
/** Traffic nobody declared: a diamond in the middle of the edge. */
const UNDECLARED = "#7b3fb3";
/**
 * A SAN mismatch (the caller's TLS context expects a name the callee's certificate
 * does not carry): a square a third of the way along the edge, on the caller's side.
 */
const MISMATCH = "#b00020";
/** The edges of what is hovered or selected, drawn again on top, wider. */
const HOT = "#1f4f8f";
/** Alpha of the other edges while something is hovered or selected. */
const DIMMED = 0.35;

/**
 * How an edge's error ratio is drawn: failing (red) above `warning`, the aggregator's
 * --error-ratio-warning that every graph answer carries (`errorRatioWarning`, the
 * threshold of the status rule, read there and never written here); with errors at
 * or below it, amber; without, plain.
 */
export function severity(ratio, warning) {
  return ratio > warning ? "bad" : ratio > 0 ? "warn" : "ok";
}

/** The key of EDGE_STYLES an edge is drawn with. */
export function edgeState(e, warning) {
  return e.observed ? severity(e.errorRatio, warning) : "idle";
}

export function nodeStyle(node) {
  return node.kind === "external" ? NODE_STYLE.external : NODE_STYLE[node.status] || NODE_STYLE.down;
}

function nodeKey(node) {
  return node.kind === "external" ? "external" : (NODE_STYLE[node.status] ? node.status : "down");
}

const FONT = 'system-ui, -apple-system, "Segoe UI", Roboto, sans-serif';

/** The colours of the pixel renderer, converted once. */
const PX = {
  background: rgba(BACKGROUND), blockFill: rgba(BLOCK_FILL), blockLine: rgba(BLOCK_LINE), ink: rgba(INK),
  hot: rgba(HOT), undeclared: rgba(UNDECLARED), mismatch: rgba(MISMATCH), white: rgba("#ffffff"),
  edge: Object.fromEntries(Object.entries(EDGE_STYLES).map(([key, s]) => [key, rgba(s.colour)])),
  node: Object.fromEntries(Object.entries(NODE_STYLE).map(([key, s]) => [key, rgba(s.fill)])),
};

export class GraphCanvas {
  /**
   * `canvas`: the element; `on`: {open(node), hover(hit|null, clientX, clientY),
   * select(hit|null), drawn(first)}. A hit is {node: i} or {edge: i}.
   */
  constructor(canvas, on) {
    this.canvas = canvas;
    this.ctx = canvas.getContext("2d", { alpha: false });
    this.on = on;
    this.model = null;
    this.k = 1; this.tx = 0; this.ty = 0;
    this.w = 0; this.h = 0; this.dpr = 1;
    this.fitted = false;
    /** Panned or zoomed since the last fit: a resize then keeps the view, else refits. */
    this.moved = false;
    this.hot = null;
    this.selected = null;
    this.queued = false;
    this.frames = 0;
    this.lastDrawMs = 0;
    /** Whether the last frame was drawn into pixels (graph-raster.js). */
    this.pixels = false;
    this.raster = new Raster();
    this.masks = new Map();
    this.pointers = new Map();
    this.drag = null;
    this.markNext = false;
    this.frame = () => { this.queued = false; this.draw(); };
    // For tests and the benchmark: the element leads to its renderer.
    canvas.graph = this;
    this.listen();
    this.resizer = new ResizeObserver(() => this.resize());
    this.resizer.observe(canvas);
  }

  destroy() {
    this.resizer.disconnect();
    this.model = null;
  }

  /** New data; `keepView` keeps pan and zoom (a refresh), else the graph is fitted. */
  setData(model, keepView, mark) {
    this.model = model;
    this.prepare();
    if (!keepView) this.fitted = false;
    if (this.hot && !this.valid(this.hot)) this.hot = null;
    if (this.selected && !this.valid(this.selected)) this.selected = null;
    if (mark) this.markNext = true;
    if (!this.fitted && this.w) this.fit();
    this.invalidate();
  }

  valid(hit) {
    const m = this.model;
    return hit.node !== undefined ? hit.node < m.nodes.length : hit.edge < m.edges.length;
  }

  /**
   * What every frame reuses, computed once per data: each edge's curve and box in
   * world units, the edges of each style and the nodes of each status (in drawing
   * order), the few edges with a marker or a label and each node's edges; the hit
   * tests' spatial index comes after the first frame. A frame allocates nothing per
   * edge.
   */
  prepare() {
    const { nodes, edges, x, y, warning } = this.model;
    const n = edges.length;
    const g = new Float64Array(n * 8); // sx sy cx cy ex ey ux uy
    const box = new Float64Array(n * 4); // minX minY maxX maxY
    const byStyle = new Map(Object.keys(EDGE_STYLES).map((key) => [key, []]));
    const undeclared = [];
    const mismatched = [];
    const labelled = [];
    const adj = nodes.map(() => []);
    edges.forEach((e, i) => {
      adj[e.s].push(i);
      adj[e.t].push(i);
      const x0 = x[e.s], y0 = y[e.s], x1 = x[e.t], y1 = y[e.t];
      const dx = x1 - x0, dy = y1 - y0;
      const len = Math.sqrt(dx * dx + dy * dy) || 1;
      // A slight bend to the left of the direction of travel: A->B and B->A apart.
      const bend = Math.min(0.14 * len, 90);
      const cx = (x0 + x1) / 2 - (dy / len) * bend;
      const cy = (y0 + y1) / 2 + (dx / len) * bend;
      // Unit vectors along the curve at its two ends.
      const la = Math.sqrt((cx - x0) ** 2 + (cy - y0) ** 2) || 1, lb = Math.sqrt((x1 - cx) ** 2 + (y1 - cy) ** 2) || 1;
      const ax = (cx - x0) / la, ay = (cy - y0) / la, bx = (x1 - cx) / lb, by = (y1 - cy) / lb;
      const o = i * 8;
      g[o] = x0 + ax * RADIUS; g[o + 1] = y0 + ay * RADIUS;
      g[o + 2] = cx; g[o + 3] = cy;
      g[o + 4] = x1 - bx * (RADIUS + 1); g[o + 5] = y1 - by * (RADIUS + 1);
      g[o + 6] = bx; g[o + 7] = by;
      box[i * 4] = Math.min(g[o], g[o + 2], g[o + 4]);
      box[i * 4 + 1] = Math.min(g[o + 1], g[o + 3], g[o + 5]);
      box[i * 4 + 2] = Math.max(g[o], g[o + 2], g[o + 4]);
      box[i * 4 + 3] = Math.max(g[o + 1], g[o + 3], g[o + 5]);
      byStyle.get(edgeState(e, warning)).push(i);
      if (e.observed && !e.declared) undeclared.push(i);
      if (e.tlsIdentity && !e.tlsIdentity.match) mismatched.push(i);
      if (e.observed && e.errorRatio > 0) labelled.push(i);
    });
    const byStatus = new Map(Object.keys(NODE_STYLE).map((key) => [key, []]));
    const unregistered = [];
    nodes.forEach((node, i) => {
      byStatus.get(nodeKey(node)).push(i);
      if (node.kind === "cluster" && !node.registered) unregistered.push(i);
    });
    this.geo = g;
    this.box = box;
    this.styles = [...byStyle].filter(([, list]) => list.length).map(([key, list]) => ({ key, list: Int32Array.from(list) }));
    this.statuses = [...byStatus].filter(([, list]) => list.length).map(([key, list]) => ({ key, list: Int32Array.from(list) }));
    this.undeclared = Int32Array.from(undeclared);
    this.mismatched = Int32Array.from(mismatched);
    this.labelled = Int32Array.from(labelled);
    this.unregistered = Int32Array.from(unregistered);
    this.adj = adj;
    this.ids = new Map(nodes.map((node, i) => [node.id, i]));
    this.shownEdges = new Int32Array(n);
    this.shownNodes = new Int32Array(nodes.length);
    // Built once the first frame is out (or when first asked).
    this.index = null;
    requestAnimationFrame(() => setTimeout(() => this.cells(), 0));
  }

  /** The hit tests' spatial index of the current data. */
  cells() {
    const m = this.model;
    if (m && !this.index) this.index = new Cells(m.x, m.y, m.nodes.length, this.box, m.edges.length, m.bounds);
    return this.index;
  }

  resize() {
    const r = this.canvas.getBoundingClientRect();
    const dpr = window.devicePixelRatio || 1;
    const w = Math.max(1, Math.round(r.width)), h = Math.max(1, Math.round(r.height));
    if (w === this.w && h === this.h && dpr === this.dpr) return;
    // Keep the centre of the view where it was.
    if (this.w) { this.tx += (w - this.w) / 2; this.ty += (h - this.h) / 2; }
    this.w = w; this.h = h; this.dpr = dpr;
    this.canvas.width = Math.round(w * dpr);
    this.canvas.height = Math.round(h * dpr);
    if ((!this.fitted || !this.moved) && this.model) this.fit();
    this.invalidate();
  }

  /** Pan and zoom so the whole graph is in sight. */
  fit() {
    const m = this.model;
    if (!m || !this.w) return;
    const pad = 24;
    const top = m.blocks.length && m.blocks[0].title ? 18 : 0;
    // Labels hang right of their node.
    const bw = m.bounds.maxX - m.bounds.minX + 2 * RADIUS + 150;
    const bh = m.bounds.maxY - m.bounds.minY + 2 * RADIUS + 20;
    const k = clamp(Math.min((this.w - 2 * pad) / bw, (this.h - 2 * pad - top) / bh), MIN_K, 1.4);
    this.k = k;
    this.tx = (this.w - bw * k) / 2 - (m.bounds.minX - RADIUS) * k;
    this.ty = (this.h - bh * k + top) / 2 - (m.bounds.minY - RADIUS) * k;
    this.fitted = true;
    this.moved = false;
    this.invalidate();
  }

  zoomAt(factor, sx, sy) {
    const k = clamp(this.k * factor, MIN_K, MAX_K);
    const f = k / this.k;
    this.tx = sx - (sx - this.tx) * f;
    this.ty = sy - (sy - this.ty) * f;
    this.k = k;
    this.moved = true;
    this.invalidate();
  }

  zoom(factor) {
    this.zoomAt(factor, this.w / 2, this.h / 2);
  }

  panBy(dx, dy) {
    this.tx += dx; this.ty += dy;
    this.moved = true;
    this.invalidate();
  }

  /** Brings node `id` to the middle, zoomed in enough to read it; answers its index. */
  center(id) {
    const i = this.ids ? this.ids.get(id) : undefined;
    if (i === undefined) return -1;
    this.k = Math.max(this.k, 1);
    this.tx = this.w / 2 - this.model.x[i] * this.k;
    this.ty = this.h / 2 - this.model.y[i] * this.k;
    this.fitted = true;
    this.moved = true;
    this.invalidate();
    return i;
  }

  /** Where node `id` is on the canvas, CSS pixels from its top-left corner. */
  nodePosition(id) {
    const i = this.ids ? this.ids.get(id) : undefined;
    if (i === undefined) return null;
    return { x: this.model.x[i] * this.k + this.tx, y: this.model.y[i] * this.k + this.ty };
  }

  /**
   * Where the SAN mismatch mark of the edge `source` -> `target` is drawn, CSS pixels
   * from the canvas's top-left corner; null when that edge has none.
   */
  mismatchMark(source, target) {
    if (!this.model || !this.mismatched) return null;
    const i = this.mismatched.find((j) => this.model.edges[j].source === source && this.model.edges[j].target === target);
    if (i === undefined) return null;
    const [x, y] = along(this.geo, i * 8, 1 / 3);
    return { x: x * this.k + this.tx, y: y * this.k + this.ty };
  }

  setSelected(hit) {
    this.selected = hit;
    this.invalidate();
  }

  invalidate() {
    if (this.queued) return;
    this.queued = true;
    requestAnimationFrame(this.frame);
  }

  // ------------------------------------------------------------ drawing

  draw() {
    const t0 = performance.now();
    const { ctx, dpr, k, tx, ty, w, h } = this;
    const m = this.model;
    if (!m || !w) {
      ctx.setTransform(1, 0, 0, 1, 0, 0);
      ctx.fillStyle = BACKGROUND;
      ctx.fillRect(0, 0, this.canvas.width, this.canvas.height);
      return;
    }
    // The world rectangle in sight, with a margin for labels and bends.
    const v = {
      x0: -tx / k - 200, y0: -ty / k - 60,
      x1: (w - tx) / k + 60, y1: (h - ty) / k + 60,
    };
    this.view = v;
    const shown = this.cull(v);
    const hotEdges = this.hotEdges();
    this.pixels = shown.edges > PIXELS_EDGES || shown.nodes > PIXELS_NODES;
    if (this.pixels) {
      this.rasterize(m, hotEdges);
    } else {
      ctx.setTransform(1, 0, 0, 1, 0, 0);
      ctx.fillStyle = BACKGROUND;
      ctx.fillRect(0, 0, this.canvas.width, this.canvas.height);
      ctx.setTransform(dpr * k, 0, 0, dpr * k, dpr * tx, dpr * ty);
      this.drawBlocks(m, v);
      this.drawEdges(m, hotEdges);
      this.drawNodes(m);
    }
    ctx.setTransform(dpr * k, 0, 0, dpr * k, dpr * tx, dpr * ty);
    this.drawRings(m);
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    this.drawText(m, v, hotEdges);
    this.frames++;
    this.lastDrawMs = performance.now() - t0;
    if (this.markNext) {
      this.markNext = false;
      // For bench/dashboard.py --graph: the first frame with every node of a view.
      performance.mark("meshcat-graph-drawn", { detail: { nodes: m.nodes.length, edges: m.edges.length } });
      if (this.on.drawn) this.on.drawn();
    }
  }

  /**
   * The edges and nodes in the world rectangle `v`: their indexes go to the front
   * of `shownEdges` and `shownNodes`, each style's and each status's after the one
   * before (from `from` to `to`). Answers the counts.
   */
  cull(v) {
    const { box, shownEdges, shownNodes } = this;
    const { x, y } = this.model;
    let e = 0;
    for (const style of this.styles) {
      const start = e;
      for (const i of style.list) {
        const o = i * 4;
        if (box[o] > v.x1 || box[o + 2] < v.x0 || box[o + 1] > v.y1 || box[o + 3] < v.y0) continue;
        shownEdges[e++] = i;
      }
      style.from = start;
      style.to = e;
    }
    let n = 0;
    for (const status of this.statuses) {
      status.from = n;
      for (const i of status.list) {
        if (x[i] >= v.x0 && x[i] <= v.x1 && y[i] >= v.y0 && y[i] <= v.y1) shownNodes[n++] = i;
      }
      status.to = n;
    }
    this.nodesShown = n;
    return { edges: e, nodes: n };
  }

  inView(i, v) {
    const { box } = this;
    const o = i * 4;
    return !(box[o] > v.x1 || box[o + 2] < v.x0 || box[o + 1] > v.y1 || box[o + 3] < v.y0);
  }

  /** Edges of the hovered or selected node, or the hovered or selected edge. */
  hotEdges() {
    const set = new Set();
    for (const hit of [this.selected, this.hot]) {
      if (!hit) continue;
      if (hit.node !== undefined) for (const e of this.adj[hit.node]) set.add(e);
      else set.add(hit.edge);
    }
    return set;
  }

  drawBlocks(m, v) {
    const { ctx, k } = this;
    if (!m.blocks.length || !m.blocks[0].title) return;
    ctx.lineWidth = 1 / k;
    ctx.strokeStyle = BLOCK_LINE;
    ctx.fillStyle = BLOCK_FILL;
    for (const b of m.blocks) {
      if (b.x > v.x1 || b.y > v.y1 || b.x + b.w < v.x0 || b.y + b.h < v.y0) continue;
      ctx.beginPath();
      ctx.rect(b.x, b.y, b.w, b.h);
      ctx.fill();
      ctx.stroke();
    }
  }

  drawEdges(m, hotEdges) {
    const { ctx, k, geo, shownEdges } = this;
    const arrows = k >= ARROW_K;
    const al = 7 / k;
    ctx.globalAlpha = hotEdges.size ? DIMMED : 1;
    for (const style of this.styles) {
      if (style.from === style.to) continue;
      const s = EDGE_STYLES[style.key];
      ctx.strokeStyle = s.colour;
      ctx.fillStyle = s.colour;
      ctx.lineWidth = s.width / k;
      ctx.beginPath();
      for (let j = style.from; j < style.to; j++) curve(ctx, geo, shownEdges[j] * 8, s.dash, k, this.view);
      ctx.stroke();
      if (arrows) {
        ctx.beginPath();
        for (let j = style.from; j < style.to; j++) arrowHead(ctx, geo, shownEdges[j] * 8, al);
        ctx.fill();
      }
    }
    ctx.globalAlpha = 1;
    ctx.setLineDash([]);
    // Undeclared traffic: a diamond in the middle of the edge.
    const d = Math.max(4.5 / k, 3);
    ctx.fillStyle = UNDECLARED;
    ctx.strokeStyle = "#ffffff";
    ctx.lineWidth = 1 / k;
    ctx.beginPath();
    let any = false;
    for (const i of this.undeclared) {
      if (!this.inView(i, this.view)) continue;
      const [mx, my] = midpoint(geo, i * 8);
      ctx.moveTo(mx, my - d); ctx.lineTo(mx + d, my); ctx.lineTo(mx, my + d); ctx.lineTo(mx - d, my); ctx.closePath();
      any = true;
    }
    if (any) { ctx.fill(); ctx.stroke(); }
    // A SAN mismatch: a square on the caller's side.
    ctx.fillStyle = MISMATCH;
    ctx.beginPath();
    any = false;
    for (const i of this.mismatched) {
      if (!this.inView(i, this.view)) continue;
      const [mx, my] = along(geo, i * 8, 1 / 3);
      ctx.rect(mx - d * 0.8, my - d * 0.8, d * 1.6, d * 1.6);
      any = true;
    }
    if (any) { ctx.fill(); ctx.stroke(); }
    // The edges of what is hovered or selected, on top.
    if (hotEdges.size) {
      ctx.strokeStyle = HOT;
      ctx.fillStyle = HOT;
      for (const i of hotEdges) {
        const s = EDGE_STYLES[edgeState(m.edges[i], m.warning)];
        const o = i * 8;
        ctx.lineWidth = hotWidth(s) / k;
        ctx.beginPath();
        curve(ctx, geo, o, s.dash, k, this.view);
        ctx.stroke();
        ctx.beginPath();
        arrowHead(ctx, geo, o, Math.max(al, 9 / k));
        ctx.fill();
      }
    }
  }

  drawNodes(m) {
    const { ctx, k, shownNodes } = this;
    const { x, y } = m;
    const r = Math.max(RADIUS, 1.8 / k);
    const v = this.view;
    for (const { key, from, to } of this.statuses) {
      ctx.fillStyle = NODE_STYLE[key].fill;
      ctx.beginPath();
      for (let j = from; j < to; j++) {
        const i = shownNodes[j];
        if (key === "external") ctx.rect(x[i] - r, y[i] - r, 2 * r, 2 * r);
        else { ctx.moveTo(x[i] + r, y[i]); ctx.arc(x[i], y[i], r, 0, 2 * Math.PI); }
      }
      ctx.fill();
    }
    // A cluster known only from a declared dependency: a dashed ring, not registered.
    ctx.strokeStyle = INK;
    ctx.lineWidth = 1.5 / k;
    ctx.setLineDash([3 / k, 2.5 / k]);
    ctx.beginPath();
    for (const i of this.unregistered) {
      if (x[i] < v.x0 || x[i] > v.x1 || y[i] < v.y0 || y[i] > v.y1) continue;
      ctx.moveTo(x[i] + r + 3 / k, y[i]);
      ctx.arc(x[i], y[i], r + 3 / k, 0, 2 * Math.PI);
    }
    ctx.stroke();
    ctx.setLineDash([]);
  }

  /** The rings of the focused, selected and hovered nodes, over either renderer's nodes. */
  drawRings(m) {
    const { ctx, k } = this;
    const { x, y } = m;
    const r = Math.max(RADIUS, 1.8 / k);
    const ring = (i, colour, width) => {
      ctx.strokeStyle = colour;
      ctx.lineWidth = width / k;
      ctx.beginPath();
      ctx.arc(x[i], y[i], r + 5 / k, 0, 2 * Math.PI);
      ctx.stroke();
    };
    if (m.focus >= 0) ring(m.focus, INK, 3);
    if (this.selected && this.selected.node !== undefined) ring(this.selected.node, HOT, 3);
    if (this.hot && this.hot.node !== undefined) ring(this.hot.node, HOT, 2);
  }

  /**
   * What drawBlocks, drawEdges and drawNodes draw, the same way and in the same
   * order, written into pixels (graph-raster.js) and put on the canvas at once.
   */
  rasterize(m, hotEdges) {
    const { dpr, k, tx, ty, geo, shownEdges, shownNodes, raster } = this;
    const { x, y } = m;
    const sx = (wx) => (wx * k + tx) * dpr;
    const sy = (wy) => (wy * k + ty) * dpr;
    raster.begin(this.canvas.width, this.canvas.height, PX.background);
    if (m.blocks.length && m.blocks[0].title) {
      for (const b of m.blocks) raster.rect(sx(b.x), sy(b.y), sx(b.x + b.w), sy(b.y + b.h), PX.blockFill, PX.blockLine);
    }
    const arrows = k >= ARROW_K;
    const alpha = hotEdges.size ? Math.round(DIMMED * 256) : 256;
    const line = (o, colour, a, width, dash, head) => {
      raster.quad(sx(geo[o]), sy(geo[o + 1]), sx(geo[o + 2]), sy(geo[o + 3]), sx(geo[o + 4]), sy(geo[o + 5]), colour, a, width, dash);
      if (head) this.rasterHead(o, head * dpr, colour, a);
    };
    for (const style of this.styles) {
      const s = EDGE_STYLES[style.key];
      const dash = s.dash && s.dash.map((d) => d * dpr);
      const colour = PX.edge[style.key];
      for (let j = style.from; j < style.to; j++) line(shownEdges[j] * 8, colour, alpha, s.width * dpr, dash, arrows ? 7 : 0);
    }
    const mark = this.mask("diamond", Math.max(4.5, 3 * k) * dpr, dpr);
    for (const i of this.undeclared) {
      if (!this.inView(i, this.view)) continue;
      const [mx, my] = midpoint(geo, i * 8);
      raster.stamp(mark, sx(mx), sy(my), PX.undeclared, PX.white);
    }
    const flag = this.mask("framed", Math.max(3.6, 2.4 * k) * dpr, dpr);
    for (const i of this.mismatched) {
      if (!this.inView(i, this.view)) continue;
      const [mx, my] = along(geo, i * 8, 1 / 3);
      raster.stamp(flag, sx(mx), sy(my), PX.mismatch, PX.white);
    }
    for (const i of hotEdges) {
      const s = EDGE_STYLES[edgeState(m.edges[i], m.warning)];
      line(i * 8, PX.hot, 256, hotWidth(s) * dpr, s.dash && s.dash.map((d) => d * dpr), 9);
    }
    const r = Math.max(RADIUS * k, 1.8) * dpr;
    const round = this.mask("disc", r), box = this.mask("square", r);
    for (const { key, from, to } of this.statuses) {
      const colour = PX.node[key];
      const shape = key === "external" ? box : round;
      for (let j = from; j < to; j++) raster.stamp(shape, sx(x[shownNodes[j]]), sy(y[shownNodes[j]]), colour);
    }
    const ring = this.mask("ring", r + 3 * dpr, dpr);
    for (const i of this.unregistered) raster.stamp(ring, sx(x[i]), sy(y[i]), PX.ink);
    raster.end(this.ctx);
  }

  /** An arrow head `len` device pixels long at the end of edge `o`, into pixels. */
  rasterHead(o, len, colour, a) {
    const { geo, dpr, k, tx, ty } = this;
    const ex = (geo[o + 4] * k + tx) * dpr, ey = (geo[o + 5] * k + ty) * dpr;
    const ux = geo[o + 6], uy = geo[o + 7];
    this.raster.triangle(ex, ey,
      ex - ux * len - uy * len * 0.5, ey - uy * len + ux * len * 0.5,
      ex - ux * len + uy * len * 0.5, ey - uy * len - ux * len * 0.5, colour, a);
  }

  /** The stamp of a shape at a size (device pixels), made once and kept. */
  mask(kind, r, dpr = 1) {
    const key = `${kind} ${Math.round(r * 4)} ${dpr}`;
    let mask = this.masks.get(key);
    if (!mask) {
      if (this.masks.size > 64) this.masks.clear();
      const q = Math.round(r * 4) / 4;
      mask = kind === "disc" ? disc(q) : kind === "square" ? square(q)
        : kind === "diamond" ? diamond(q, dpr) : kind === "framed" ? framedSquare(q, dpr)
        : dashedRing(q, 1.5 * dpr, 3 * dpr, 2.5 * dpr);
      this.masks.set(key, mask);
    }
    return mask;
  }

  /** Text in screen pixels: zone titles, node glyphs and names, edge error ratios. */
  drawText(m, v, hotEdges) {
    const { ctx, k, tx, ty, geo, shownNodes } = this;
    const { x, y, nodes, edges } = m;
    const sx = (wx) => wx * k + tx;
    const sy = (wy) => wy * k + ty;
    ctx.textBaseline = "middle";
    if (m.blocks.length && m.blocks[0].title) {
      // Above the block, so it never covers a node however far out the zoom is.
      ctx.font = `600 ${Math.round(clamp(15 * Math.sqrt(k * 2), 11, 16))}px ${FONT}`;
      ctx.fillStyle = INK;
      ctx.textAlign = "left";
      ctx.textBaseline = "bottom";
      for (const b of m.blocks) {
        if (b.x > v.x1 || b.y > v.y1 || b.x + b.w < v.x0 || b.y + b.h < v.y0) continue;
        ctx.fillText(`zone ${b.title}`, sx(b.x) + 4, sy(b.y) - 3);
      }
      ctx.textBaseline = "middle";
    }
    const r = RADIUS * k;
    if (r >= 6) {
      ctx.textAlign = "center";
      ctx.font = `700 ${Math.round(Math.min(r * 1.15, 22))}px ${FONT}`;
      for (let j = 0; j < this.nodesShown; j++) {
        const i = shownNodes[j];
        const s = nodeStyle(nodes[i]);
        ctx.fillStyle = s.ink;
        ctx.fillText(s.icon, sx(x[i]), sy(y[i]) + 0.5);
      }
    }
    if (k >= LABEL_K) {
      ctx.textAlign = "left";
      ctx.lineJoin = "round";
      const detail = k >= DETAIL_K;
      for (let j = 0; j < this.nodesShown; j++) {
        const i = shownNodes[j];
        const node = nodes[i];
        const lx = sx(x[i]) + Math.max(r, 3) + 5;
        const ly = sy(y[i]);
        ctx.font = `600 12px ${FONT}`;
        halo(ctx, node.kind === "external" ? `${node.clusterName} (external)` : node.clusterName, lx, detail ? ly - 7 : ly, INK);
        if (detail) {
          ctx.font = `11px ${FONT}`;
          halo(ctx, nodeWords(node), lx, ly + 8, "#4d5868");
        }
      }
      // Error ratios of failing edges (every edge's figures are in its tooltip).
      ctx.font = `700 11px ${FONT}`;
      ctx.textAlign = "center";
      const label = (i) => {
        const e = edges[i];
        const [mx, my] = midpoint(geo, i * 8);
        if (mx < v.x0 || mx > v.x1 || my < v.y0 || my > v.y1) return;
        const text = percent(e.errorRatio);
        const px = sx(mx), py = sy(my) - 11;
        const tw = ctx.measureText(text).width + 8;
        ctx.fillStyle = "#ffffff";
        ctx.fillRect(px - tw / 2, py - 8, tw, 16);
        ctx.fillStyle = { bad: "#8b1111", warn: "#6a3a00", ok: INK }[severity(e.errorRatio, m.warning)];
        ctx.fillText(text, px, py);
      };
      for (const i of this.labelled) label(i);
      for (const i of hotEdges) if (edges[i].observed && !(edges[i].errorRatio > 0)) label(i);
    }
  }

  // ------------------------------------------------------------ input

  /**
   * What is under a point of the canvas (CSS pixels): the nearest node within its
   * radius and a few pixels, else the nearest edge within 5 pixels. Looks only in the
   * spatial index's cells near the point.
   */
  hitTest(px, py) {
    const m = this.model;
    if (!m) return null;
    const wx = (px - this.tx) / this.k, wy = (py - this.ty) / this.k;
    const r = Math.max(RADIUS, 1.8 / this.k) + 4 / this.k;
    const tol = 5 / this.k;
    const near = this.cells().near(wx, wy, Math.max(r, tol));
    let best = -1, bestD = r * r;
    for (const i of near.nodes) {
      const dx = m.x[i] - wx, dy = m.y[i] - wy;
      const d = dx * dx + dy * dy;
      // Of two at the same distance, the later one (drawn on top).
      if (d < bestD || (d === bestD && i > best)) { bestD = d; best = i; }
    }
    if (best >= 0) return { node: best };
    const g = this.geo, box = this.box;
    let edge = -1, edgeD = tol * tol;
    for (const i of near.edges) {
      const o = i * 8;
      if (wx < box[i * 4] - tol || wx > box[i * 4 + 2] + tol) continue;
      if (wy < box[i * 4 + 1] - tol || wy > box[i * 4 + 3] + tol) continue;
      // The curve as six straight pieces.
      let ax = g[o], ay = g[o + 1];
      for (let s = 1; s <= 6; s++) {
        const t = s / 6, u = 1 - t;
        const bx = u * u * g[o] + 2 * u * t * g[o + 2] + t * t * g[o + 4];
        const by = u * u * g[o + 1] + 2 * u * t * g[o + 3] + t * t * g[o + 5];
        const d = segDist2(wx, wy, ax, ay, bx, by);
        // Of two at the same distance, the first.
        if (d < edgeD || (d === edgeD && i < edge)) { edgeD = d; edge = i; }
        ax = bx; ay = by;
      }
    }
    return edge >= 0 ? { edge } : null;
  }

  listen() {
    const c = this.canvas;
    const local = (e) => {
      const r = c.getBoundingClientRect();
      return [e.clientX - r.left, e.clientY - r.top];
    };
    c.addEventListener("pointerdown", (e) => {
      if (e.pointerType === "mouse" && e.button !== 0) return;
      // Keeps the drag when the pointer leaves the canvas; a pointer the browser
      // does not track (a synthetic one) cannot be captured and drags all the same.
      try { c.setPointerCapture(e.pointerId); } catch { /* not capturable */ }
      const [px, py] = local(e);
      this.pointers.set(e.pointerId, { x: px, y: py });
      if (this.pointers.size === 1) this.drag = { x: px, y: py, moved: 0 };
      else this.drag = null;
    });
    c.addEventListener("pointermove", (e) => {
      const [px, py] = local(e);
      const p = this.pointers.get(e.pointerId);
      if (!p) {
        this.hover(px, py, e.clientX, e.clientY);
        return;
      }
      if (this.pointers.size === 2) {
        // Pinch: zoom by the change of the distance between the two fingers.
        const [a, b] = [...this.pointers.values()];
        const before = Math.hypot(a.x - b.x, a.y - b.y);
        p.x = px; p.y = py;
        const after = Math.hypot(a.x - b.x, a.y - b.y);
        if (before > 0) this.zoomAt(after / before, (a.x + b.x) / 2, (a.y + b.y) / 2);
        return;
      }
      const dx = px - p.x, dy = py - p.y;
      p.x = px; p.y = py;
      if (!dx && !dy) return;
      if (this.drag) this.drag.moved += Math.abs(dx) + Math.abs(dy);
      this.panBy(dx, dy);
    });
    const end = (e) => {
      const p = this.pointers.get(e.pointerId);
      this.pointers.delete(e.pointerId);
      if (!p || e.type === "pointercancel") { this.drag = null; return; }
      const d = this.drag;
      this.drag = null;
      if (d && d.moved < 6) {
        const [px, py] = local(e);
        const hit = this.hitTest(px, py);
        this.selected = hit;
        this.invalidate();
        if (this.on.select) this.on.select(hit);
        if (hit && hit.node !== undefined && this.on.open) this.on.open(this.model.nodes[hit.node]);
      }
    };
    c.addEventListener("pointerup", end);
    c.addEventListener("pointercancel", end);
    c.addEventListener("pointerleave", () => {
      if (!this.pointers.size && this.hot) { this.hot = null; this.invalidate(); }
      if (this.on.hover) this.on.hover(null);
    });
    c.addEventListener("wheel", (e) => {
      e.preventDefault();
      const [px, py] = local(e);
      const unit = e.deltaMode === 1 ? 16 : e.deltaMode === 2 ? this.h : 1;
      this.zoomAt(Math.exp(-clamp(e.deltaY * unit, -300, 300) * 0.0016), px, py);
    }, { passive: false });
    c.addEventListener("dblclick", (e) => {
      const [px, py] = local(e);
      this.zoomAt(2, px, py);
    });
    c.addEventListener("keydown", (e) => {
      const step = 80;
      const keys = {
        ArrowLeft: () => this.panBy(step, 0), ArrowRight: () => this.panBy(-step, 0),
        ArrowUp: () => this.panBy(0, step), ArrowDown: () => this.panBy(0, -step),
        "+": () => this.zoom(1.25), "=": () => this.zoom(1.25), "-": () => this.zoom(0.8),
        0: () => this.fit(),
      };
      const f = keys[e.key];
      if (f) { e.preventDefault(); f(); }
    });
  }

  hover(px, py, clientX, clientY) {
    const hit = this.hitTest(px, py);
    const same = (a, b) => (a === b) || (a && b && a.node === b.node && a.edge === b.edge);
    if (!same(hit, this.hot)) { this.hot = hit; this.invalidate(); }
    this.canvas.style.cursor = hit && hit.node !== undefined ? "pointer" : "grab";
    if (this.on.hover) this.on.hover(hit, clientX, clientY);
  }
}

/**
 * Adds edge `o`'s curve to the path: whole when solid; when dashed (`dash` in CSS
 * pixels), the dashes of its straight pieces in the world rectangle `v`, counted
 * from its start so they hold still while the view moves. The canvas's own dashing
 * walks every dash of a curve, in sight or not, which for an edge thousands of
 * pixels long (zoomed in) costs more than the whole frame.
 */
function curve(ctx, g, o, dash, k, v) {
  const x0 = g[o], y0 = g[o + 1], cx = g[o + 2], cy = g[o + 3], x1 = g[o + 4], y1 = g[o + 5];
  if (!dash) {
    ctx.moveTo(x0, y0);
    ctx.quadraticCurveTo(cx, cy, x1, y1);
    return;
  }
  const on = dash[0] / k, period = (dash[0] + dash[1]) / k;
  const n = pieces(x0 * k, y0 * k, cx * k, cy * k, x1 * k, y1 * k);
  let ax = x0, ay = y0, along = 0;
  for (let s = 1; s <= n; s++) {
    const t = s / n, u = 1 - t;
    const bx = u * u * x0 + 2 * u * t * cx + t * t * x1;
    const by = u * u * y0 + 2 * u * t * cy + t * t * y1;
    const len = Math.hypot(bx - ax, by - ay);
    const inView = !(Math.min(ax, bx) > v.x1 || Math.max(ax, bx) < v.x0 || Math.min(ay, by) > v.y1 || Math.max(ay, by) < v.y0);
    if (inView && len > 0) {
      // Each dash that starts before this piece ends, clipped to the piece.
      for (let d = Math.floor(along / period) * period; d < along + len; d += period) {
        const f0 = Math.max(d, along) - along, f1 = Math.min(d + on, along + len) - along;
        if (f1 <= f0) continue;
        ctx.moveTo(ax + (bx - ax) * f0 / len, ay + (by - ay) * f0 / len);
        ctx.lineTo(ax + (bx - ax) * f1 / len, ay + (by - ay) * f1 / len);
      }
    }
    along += len;
    ax = bx; ay = by;
  }
}

/** The width of an edge drawn as hovered or selected, CSS pixels: one more than its style's. */
function hotWidth(style) {
  return style.width + 1;
}

/**
 * The hit tests' spatial index: the nodes and the edges' boxes by square cells of
 * CELL world units over the graph's bounds, as one array of indexes per kind with
 * each cell's run in it (built in two passes, no array per cell). An edge whose box
 * spans more than MAX_CELLS cells (a long call across zones) is kept apart and looked
 * at by every query.
 */
class Cells {
  constructor(x, y, nodeCount, box, edgeCount, bounds) {
    this.x0 = bounds.minX;
    this.y0 = bounds.minY;
    this.cols = Math.max(1, Math.ceil((bounds.maxX - bounds.minX) / CELL) + 1);
    this.rows = Math.max(1, Math.ceil((bounds.maxY - bounds.minY) / CELL) + 1);
    const col = (wx) => clamp(Math.floor((wx - this.x0) / CELL), 0, this.cols - 1);
    const row = (wy) => clamp(Math.floor((wy - this.y0) / CELL), 0, this.rows - 1);
    const size = this.cols * this.rows;
    const long = [];
    // Each item's cells: a node's one, an edge's box (or none when it is long).
    const span = (i, visit) => {
      const o = i * 4;
      const c0 = col(box[o]), r0 = row(box[o + 1]), c1 = col(box[o + 2]), r1 = row(box[o + 3]);
      if ((c1 - c0 + 1) * (r1 - r0 + 1) > MAX_CELLS) return false;
      for (let r = r0; r <= r1; r++) for (let c = c0; c <= c1; c++) visit(r * this.cols + c);
      return true;
    };
    const build = (count, each) => {
      const start = new Int32Array(size + 1);
      for (let i = 0; i < count; i++) each(i, (cell) => { start[cell + 1]++; });
      for (let c = 0; c < size; c++) start[c + 1] += start[c];
      const fill = start.slice(0, size);
      const items = new Int32Array(start[size]);
      for (let i = 0; i < count; i++) each(i, (cell) => { items[fill[cell]++] = i; });
      return { start, items };
    };
    this.nodes = build(nodeCount, (i, visit) => visit(row(y[i]) * this.cols + col(x[i])));
    this.edges = build(edgeCount, (i, visit) => span(i, visit));
    for (let i = 0; i < edgeCount; i++) if (!span(i, () => {})) long.push(i);
    this.long = long;
  }

  /** The nodes and edges in the cells within `reach` of (wx, wy); an edge may come twice. */
  near(wx, wy, reach) {
    const nodes = [], edges = [...this.long];
    // Clamped both ways, as the items were: what lies out of the bounds (a bend) is
    // in the border cells.
    const col = (wx1) => clamp(Math.floor((wx1 - this.x0) / CELL), 0, this.cols - 1);
    const row = (wy1) => clamp(Math.floor((wy1 - this.y0) / CELL), 0, this.rows - 1);
    const c0 = col(wx - reach), c1 = col(wx + reach), r0 = row(wy - reach), r1 = row(wy + reach);
    for (let r = r0; r <= r1; r++) {
      for (let c = c0; c <= c1; c++) {
        const cell = r * this.cols + c;
        for (const [kind, out] of [[this.nodes, nodes], [this.edges, edges]]) {
          for (let j = kind.start[cell]; j < kind.start[cell + 1]; j++) out.push(kind.items[j]);
        }
      }
    }
    return { nodes, edges };
  }
}

/** The status word and instance count shown under a node's name. */
export function nodeWords(node) {
  if (node.kind === "external") return "external service";
  const status = node.status || "down";
  if (!node.registered) return `${status} \u00b7 not registered`;
  return `${status} \u00b7 ${node.instances} instance${node.instances === 1 ? "" : "s"}`;
}

export function percent(ratio) {
  if (!(ratio > 0)) return "0 %";
  const p = ratio * 100;
  return `${p < 0.1 ? "<0.1" : p < 10 ? String(Number(p.toFixed(1))) : Math.round(p)} %`;
}

function halo(ctx, text, x, y, colour) {
  ctx.strokeStyle = "rgba(251, 252, 254, 0.9)";
  ctx.lineWidth = 3;
  ctx.strokeText(text, x, y);
  ctx.fillStyle = colour;
  ctx.fillText(text, x, y);
}

function arrowHead(ctx, g, o, len) {
  const ex = g[o + 4], ey = g[o + 5], ux = g[o + 6], uy = g[o + 7];
  ctx.moveTo(ex, ey);
  ctx.lineTo(ex - ux * len - uy * len * 0.5, ey - uy * len + ux * len * 0.5);
  ctx.lineTo(ex - ux * len + uy * len * 0.5, ey - uy * len - ux * len * 0.5);
  ctx.closePath();
}

function midpoint(g, o) {
  return along(g, o, 0.5);
}

/** The point at `t` (0 at the source, 1 at the target) along edge `o`'s curve. */
function along(g, o, t) {
  const a = (1 - t) * (1 - t), b = 2 * t * (1 - t), c = t * t;
  return [a * g[o] + b * g[o + 2] + c * g[o + 4], a * g[o + 1] + b * g[o + 3] + c * g[o + 5]];
}

function clamp(v, lo, hi) {
  return Math.min(hi, Math.max(lo, v));
}

function segDist2(px, py, ax, ay, bx, by) {
  const dx = bx - ax, dy = by - ay;
  const l = dx * dx + dy * dy;
  let t = l ? ((px - ax) * dx + (py - ay) * dy) / l : 0;
  t = clamp(t, 0, 1);
  const qx = ax + t * dx - px, qy = ay + t * dy - py;
  return qx * qx + qy * qy;
}
