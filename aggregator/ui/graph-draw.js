// meshcat dashboard: the dependency graph on a <canvas>. One canvas instead of
// thousands of SVG elements keeps 1,000 nodes and 3,000 edges fluid: edges are
// stroked in a handful of batched paths (one per style), nodes filled in one path
// per status, text is drawn only where it is readable (zoomed in) and only for what
// is in sight. A frame is drawn only when something asked for it (data, pan, zoom,
// hover, resize), never in a loop. Pan by dragging (or the arrow keys), zoom with the
// wheel (or + and -), 0 fits the graph; a click on a node calls `onOpen`.
//
// Colours pair with a shape or a glyph, never alone: stable ✔, warning ▲, down ✖,
// an external service is a square with ↗; an edge's error ratio is its colour, its
// width and, zoomed in, a label; a dashed edge carries no traffic (declared only), a
// diamond on an edge marks traffic nobody declared.

/** Node radius, world units. */
export const RADIUS = 11;
const MIN_K = 0.02;
const MAX_K = 4;
/** Zoom from which labels, edge figures and second lines are drawn. */
const LABEL_K = 0.5;
const DETAIL_K = 0.85;
const ARROW_K = 0.3;

export const NODE_STYLE = {
  stable: { fill: "#1c7c37", ink: "#ffffff", icon: "\u2714" },
  warning: { fill: "#e3a008", ink: "#3b2600", icon: "\u25B2" },
  down: { fill: "#c62828", ink: "#ffffff", icon: "\u2716" },
  external: { fill: "#55657a", ink: "#ffffff", icon: "\u2197" },
};
export const EDGE_STYLE = {
  ok: "#5d6f86",
  warn: "#c06a00",
  bad: "#c62828",
  idle: "#8a95a5",
  undeclared: "#7b3fb3",
  hot: "#1f4f8f",
};
/**
 * How an edge's error ratio is drawn: failing (red) above `warning`, the aggregator's
 * --error-ratio-warning that every graph answer carries (`errorRatioWarning`, the
 * threshold of the status rule, read there and never written here); with errors at
 * or below it, amber; without, plain.
 */
export function severity(ratio, warning) {
  return ratio > warning ? "bad" : ratio > 0 ? "warn" : "ok";
}

export function nodeStyle(node) {
  return node.kind === "external" ? NODE_STYLE.external : NODE_STYLE[node.status] || NODE_STYLE.down;
}

/**
 * Screen width of an edge, in CSS pixels, by its style: failing edges are wider.
 * The others are one pixel: hairlines, which Chromium's software rasterizer strokes
 * several times faster than wider lines (60 frames/s against 37 with 3,000 edges).
 */
const WIDTH = { ok: 1, warn: 2.4, bad: 3.5, idle: 1 };
function edgeWidth(ratio, warning) {
  return WIDTH[severity(ratio, warning)];
}

const FONT = 'system-ui, -apple-system, "Segoe UI", Roboto, sans-serif';

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

  /** Edge geometry in world units, computed once per data: camera moves reuse it. */
  prepare() {
    const { nodes, edges, x, y, warning } = this.model;
    const n = edges.length;
    const g = new Float64Array(n * 8); // sx sy cx cy ex ey ux uy
    const buckets = new Map();
    const adj = nodes.map(() => []);
    edges.forEach((e, i) => {
      adj[e.s].push(i);
      adj[e.t].push(i);
      const x0 = x[e.s], y0 = y[e.s], x1 = x[e.t], y1 = y[e.t];
      const dx = x1 - x0, dy = y1 - y0;
      const len = Math.hypot(dx, dy) || 1;
      // A slight bend to the left of the direction of travel: A->B and B->A apart.
      const bend = Math.min(0.14 * len, 90);
      const cx = (x0 + x1) / 2 - (dy / len) * bend;
      const cy = (y0 + y1) / 2 + (dx / len) * bend;
      const a = unit(cx - x0, cy - y0), b = unit(x1 - cx, y1 - cy);
      const o = i * 8;
      g[o] = x0 + a[0] * RADIUS; g[o + 1] = y0 + a[1] * RADIUS;
      g[o + 2] = cx; g[o + 3] = cy;
      g[o + 4] = x1 - b[0] * (RADIUS + 1); g[o + 5] = y1 - b[1] * (RADIUS + 1);
      g[o + 6] = b[0]; g[o + 7] = b[1];
      const key = e.observed ? severity(e.errorRatio, warning) : "idle";
      if (!buckets.has(key)) buckets.set(key, []);
      buckets.get(key).push(i);
    });
    const byStatus = new Map();
    nodes.forEach((node, i) => {
      const key = node.kind === "external" ? "external" : (NODE_STYLE[node.status] ? node.status : "down");
      if (!byStatus.has(key)) byStatus.set(key, []);
      byStatus.get(key).push(i);
    });
    this.geo = g;
    this.buckets = buckets;
    this.byStatus = byStatus;
    this.adj = adj;
    this.ids = new Map(nodes.map((node, i) => [node.id, i]));
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
    ctx.setTransform(1, 0, 0, 1, 0, 0);
    ctx.fillStyle = "#fbfcfe";
    ctx.fillRect(0, 0, this.canvas.width, this.canvas.height);
    const m = this.model;
    if (!m || !w) return;
    // The world rectangle in sight, with a margin for labels and bends.
    const v = {
      x0: -tx / k - 200, y0: -ty / k - 60,
      x1: (w - tx) / k + 60, y1: (h - ty) / k + 60,
    };
    ctx.setTransform(dpr * k, 0, 0, dpr * k, dpr * tx, dpr * ty);
    this.drawBlocks(m, v);
    const hotEdges = this.hotEdges();
    this.drawEdges(m, v, hotEdges);
    this.drawNodes(m, v);
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
    ctx.strokeStyle = "#d5dbe3";
    ctx.fillStyle = "#f1f4f8";
    for (const b of m.blocks) {
      if (b.x > v.x1 || b.y > v.y1 || b.x + b.w < v.x0 || b.y + b.h < v.y0) continue;
      ctx.beginPath();
      ctx.rect(b.x, b.y, b.w, b.h);
      ctx.fill();
      ctx.stroke();
    }
  }

  drawEdges(m, v, hotEdges) {
    const { ctx, k, geo } = this;
    const inView = (o) => {
      const minX = Math.min(geo[o], geo[o + 2], geo[o + 4]), maxX = Math.max(geo[o], geo[o + 2], geo[o + 4]);
      const minY = Math.min(geo[o + 1], geo[o + 3], geo[o + 5]), maxY = Math.max(geo[o + 1], geo[o + 3], geo[o + 5]);
      return !(minX > v.x1 || maxX < v.x0 || minY > v.y1 || maxY < v.y0);
    };
    const dim = hotEdges.size > 0;
    const arrows = k >= ARROW_K;
    const al = 7 / k;
    for (const [key, list] of this.buckets) {
      const observed = key !== "idle";
      ctx.strokeStyle = EDGE_STYLE[key];
      ctx.fillStyle = EDGE_STYLE[key];
      ctx.globalAlpha = dim ? 0.35 : 1;
      ctx.lineWidth = WIDTH[key] / k;
      ctx.setLineDash(observed ? [] : [6 / k, 4 / k]);
      ctx.beginPath();
      const heads = [];
      for (const i of list) {
        const o = i * 8;
        if (!inView(o)) continue;
        ctx.moveTo(geo[o], geo[o + 1]);
        ctx.quadraticCurveTo(geo[o + 2], geo[o + 3], geo[o + 4], geo[o + 5]);
        if (arrows) heads.push(o);
      }
      ctx.stroke();
      if (heads.length) {
        ctx.setLineDash([]);
        ctx.beginPath();
        for (const o of heads) arrowHead(ctx, geo, o, al);
        ctx.fill();
      }
    }
    ctx.globalAlpha = 1;
    ctx.setLineDash([]);
    // Undeclared traffic: a diamond in the middle of the edge.
    const d = Math.max(4.5 / k, 3);
    ctx.fillStyle = EDGE_STYLE.undeclared;
    ctx.strokeStyle = "#ffffff";
    ctx.lineWidth = 1 / k;
    ctx.beginPath();
    let any = false;
    m.edges.forEach((e, i) => {
      if (e.declared || !e.observed) return;
      const o = i * 8;
      if (!inView(o)) return;
      const [mx, my] = midpoint(geo, o);
      ctx.moveTo(mx, my - d); ctx.lineTo(mx + d, my); ctx.lineTo(mx, my + d); ctx.lineTo(mx - d, my); ctx.closePath();
      any = true;
    });
    if (any) { ctx.fill(); ctx.stroke(); }
    // The edges of what is hovered or selected, on top.
    if (hotEdges.size) {
      ctx.strokeStyle = EDGE_STYLE.hot;
      ctx.fillStyle = EDGE_STYLE.hot;
      for (const i of hotEdges) {
        const e = m.edges[i];
        const o = i * 8;
        ctx.lineWidth = (e.observed ? edgeWidth(e.errorRatio, m.warning) + 1 : 2) / k;
        ctx.setLineDash(e.observed ? [] : [6 / k, 4 / k]);
        ctx.beginPath();
        ctx.moveTo(geo[o], geo[o + 1]);
        ctx.quadraticCurveTo(geo[o + 2], geo[o + 3], geo[o + 4], geo[o + 5]);
        ctx.stroke();
        ctx.setLineDash([]);
        ctx.beginPath();
        arrowHead(ctx, geo, o, Math.max(al, 9 / k));
        ctx.fill();
      }
    }
  }

  drawNodes(m, v) {
    const { ctx, k } = this;
    const { x, y, nodes } = m;
    const r = Math.max(RADIUS, 1.8 / k);
    const seen = (i) => x[i] >= v.x0 && x[i] <= v.x1 && y[i] >= v.y0 && y[i] <= v.y1;
    for (const [key, list] of this.byStatus) {
      ctx.fillStyle = NODE_STYLE[key].fill;
      ctx.beginPath();
      for (const i of list) {
        if (!seen(i)) continue;
        if (key === "external") ctx.rect(x[i] - r, y[i] - r, 2 * r, 2 * r);
        else { ctx.moveTo(x[i] + r, y[i]); ctx.arc(x[i], y[i], r, 0, 2 * Math.PI); }
      }
      ctx.fill();
    }
    // A cluster known only from a declared dependency: a dashed ring, not registered.
    ctx.strokeStyle = "#18202b";
    ctx.lineWidth = 1.5 / k;
    ctx.setLineDash([3 / k, 2.5 / k]);
    ctx.beginPath();
    nodes.forEach((node, i) => {
      if (node.kind === "cluster" && !node.registered && seen(i)) {
        ctx.moveTo(x[i] + r + 3 / k, y[i]);
        ctx.arc(x[i], y[i], r + 3 / k, 0, 2 * Math.PI);
      }
    });
    ctx.stroke();
    ctx.setLineDash([]);
    const ring = (i, colour, width) => {
      ctx.strokeStyle = colour;
      ctx.lineWidth = width / k;
      ctx.beginPath();
      ctx.arc(x[i], y[i], r + 5 / k, 0, 2 * Math.PI);
      ctx.stroke();
    };
    if (m.focus >= 0) ring(m.focus, "#18202b", 3);
    if (this.selected && this.selected.node !== undefined) ring(this.selected.node, EDGE_STYLE.hot, 3);
    if (this.hot && this.hot.node !== undefined) ring(this.hot.node, EDGE_STYLE.hot, 2);
  }

  /** Text in screen pixels: zone titles, node glyphs and names, edge error ratios. */
  drawText(m, v, hotEdges) {
    const { ctx, k, tx, ty, geo } = this;
    const { x, y, nodes, edges } = m;
    const sx = (wx) => wx * k + tx;
    const sy = (wy) => wy * k + ty;
    ctx.textBaseline = "middle";
    if (m.blocks.length && m.blocks[0].title) {
      // Above the block, so it never covers a node however far out the zoom is.
      ctx.font = `600 ${Math.round(clamp(15 * Math.sqrt(k * 2), 11, 16))}px ${FONT}`;
      ctx.fillStyle = "#18202b";
      ctx.textAlign = "left";
      ctx.textBaseline = "bottom";
      for (const b of m.blocks) {
        if (b.x > v.x1 || b.y > v.y1 || b.x + b.w < v.x0 || b.y + b.h < v.y0) continue;
        ctx.fillText(`zone ${b.title}`, sx(b.x) + 4, sy(b.y) - 3);
      }
      ctx.textBaseline = "middle";
    }
    const r = RADIUS * k;
    const seen = (i) => x[i] >= v.x0 && x[i] <= v.x1 && y[i] >= v.y0 && y[i] <= v.y1;
    if (r >= 6) {
      ctx.textAlign = "center";
      ctx.font = `700 ${Math.round(Math.min(r * 1.15, 22))}px ${FONT}`;
      for (let i = 0; i < nodes.length; i++) {
        if (!seen(i)) continue;
        const s = nodeStyle(nodes[i]);
        ctx.fillStyle = s.ink;
        ctx.fillText(s.icon, sx(x[i]), sy(y[i]) + 0.5);
      }
    }
    if (k >= LABEL_K) {
      ctx.textAlign = "left";
      ctx.lineJoin = "round";
      const detail = k >= DETAIL_K;
      for (let i = 0; i < nodes.length; i++) {
        if (!seen(i)) continue;
        const node = nodes[i];
        const lx = sx(x[i]) + Math.max(r, 3) + 5;
        const ly = sy(y[i]);
        ctx.font = `600 12px ${FONT}`;
        halo(ctx, node.kind === "external" ? `${node.clusterName} (external)` : node.clusterName, lx, detail ? ly - 7 : ly, "#18202b");
        if (detail) {
          ctx.font = `11px ${FONT}`;
          halo(ctx, nodeWords(node), lx, ly + 8, "#4d5868");
        }
      }
      // Error ratios of failing edges (every edge's figures are in its tooltip).
      ctx.font = `700 11px ${FONT}`;
      ctx.textAlign = "center";
      edges.forEach((e, i) => {
        if (!(e.errorRatio > 0) && !hotEdges.has(i)) return;
        if (!e.observed) return;
        const o = i * 8;
        const [mx, my] = midpoint(geo, o);
        if (mx < v.x0 || mx > v.x1 || my < v.y0 || my > v.y1) return;
        const text = percent(e.errorRatio);
        const px = sx(mx), py = sy(my) - 11;
        const tw = ctx.measureText(text).width + 8;
        ctx.fillStyle = "#ffffff";
        ctx.fillRect(px - tw / 2, py - 8, tw, 16);
        ctx.fillStyle = { bad: "#8b1111", warn: "#6a3a00", ok: "#18202b" }[severity(e.errorRatio, m.warning)];
        ctx.fillText(text, px, py);
      });
    }
  }

  // ------------------------------------------------------------ input

  /** What is under a point of the canvas (CSS pixels): a node first, then an edge. */
  hitTest(px, py) {
    const m = this.model;
    if (!m) return null;
    const wx = (px - this.tx) / this.k, wy = (py - this.ty) / this.k;
    const r = Math.max(RADIUS, 1.8 / this.k) + 4 / this.k;
    let best = -1, bestD = r * r;
    for (let i = 0; i < m.nodes.length; i++) {
      const dx = m.x[i] - wx, dy = m.y[i] - wy;
      const d = dx * dx + dy * dy;
      if (d <= bestD) { bestD = d; best = i; }
    }
    if (best >= 0) return { node: best };
    const tol = 5 / this.k;
    const g = this.geo;
    let edge = -1, edgeD = tol * tol;
    for (let i = 0; i < m.edges.length; i++) {
      const o = i * 8;
      if (wx < Math.min(g[o], g[o + 2], g[o + 4]) - tol || wx > Math.max(g[o], g[o + 2], g[o + 4]) + tol) continue;
      if (wy < Math.min(g[o + 1], g[o + 3], g[o + 5]) - tol || wy > Math.max(g[o + 1], g[o + 3], g[o + 5]) + tol) continue;
      // The curve as six straight pieces.
      let ax = g[o], ay = g[o + 1];
      for (let s = 1; s <= 6; s++) {
        const t = s / 6, u = 1 - t;
        const bx = u * u * g[o] + 2 * u * t * g[o + 2] + t * t * g[o + 4];
        const by = u * u * g[o + 1] + 2 * u * t * g[o + 3] + t * t * g[o + 5];
        const d = segDist2(wx, wy, ax, ay, bx, by);
        if (d < edgeD) { edgeD = d; edge = i; }
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
  return [0.25 * g[o] + 0.5 * g[o + 2] + 0.25 * g[o + 4], 0.25 * g[o + 1] + 0.5 * g[o + 3] + 0.25 * g[o + 5]];
}

function unit(dx, dy) {
  const l = Math.hypot(dx, dy) || 1;
  return [dx / l, dy / l];
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
