// meshcat dashboard: where the dependency graph's nodes go. A layered layout, cheap
// and deterministic (the same graph always lands in the same place, so a refresh
// does not move what the reader is looking at): O(nodes + edges) plus one sort per
// layer, a few milliseconds for 1,000 nodes and 3,000 edges, no force iterations.
//
// - The whole mesh, or one zone: one block per zone. Inside a block, callers stand
//   left of what they call: layers by breadth-first search from the clusters nobody
//   in the zone calls (a cycle with no such entry starts from its least-called
//   member); nodes with no call at all sit in a grid at the end of the block. Blocks
//   are packed in rows, zones in name order, as many per row as makes the whole
//   largest once fitted into the canvas.
// - Around one cluster: the cluster in the middle, its callers in the columns to the
//   left (one column per hop), what it calls to the right.
//
// Inside a layer, nodes are ordered by the mean position of their neighbours in the
// layer before (one sweep down, one up), which keeps most edges short. A layer
// taller than the block's row budget wraps into more columns.

/** World units: space between rows, between the columns of one layer, between layers. */
export const ROW = 48;
export const COLUMN = 210;
const LAYER_GAP = 70;
const BLOCK_GAP = 140;
/** Height of a zone block's title. */
export const TITLE = 44;
/** The layer of a node with no call in its zone: the grid at the end of the block. */
const LOOSE = "loose";

/**
 * Places `nodes` (API order) joined by `edges` ({s, t}: node indexes).
 * `focus` is a node index or -1; `aspect` the width over the height of the canvas.
 * Answers {x, y: Float64Array, blocks: [{title, x, y, w, h}], minX, minY, maxX, maxY}.
 */
export function layout(nodes, edges, focus = -1, aspect = 2) {
  const n = nodes.length;
  const x = new Float64Array(n);
  const y = new Float64Array(n);
  const out = new Array(n).fill(null).map(() => []);
  const inc = new Array(n).fill(null).map(() => []);
  for (const e of edges) {
    if (e.s === e.t) continue;
    out[e.s].push(e.t);
    inc[e.t].push(e.s);
  }
  const blocks = [];
  if (focus >= 0) {
    const layerOf = focusLayers(n, out, inc, focus);
    const members = [];
    for (let i = 0; i < n; i++) if (layerOf[i] !== null) members.push(i);
    const b = placeBlock(members, layerOf, out, inc, x, y);
    // The focused cluster's column sits at x = 0.
    const shift = -x[focus];
    for (const i of members) x[i] += shift;
    blocks.push({ title: "", x: b.x + shift, y: 0, w: b.w, h: b.h });
    // Nodes not reached (none with the API's answer) go below, out of the way.
    let k = 0;
    for (let i = 0; i < n; i++) if (layerOf[i] === null) { x[i] = (k % 10) * COLUMN; y[i] = b.h + ROW * (1 + Math.floor(k / 10)); k++; }
  } else {
    const zones = new Map();
    nodes.forEach((node, i) => {
      const z = node.zoneName || "";
      if (!zones.has(z)) zones.set(z, []);
      zones.get(z).push(i);
    });
    const names = [...zones.keys()].sort();
    const zoneOf = new Array(n);
    for (const z of names) for (const i of zones.get(z)) zoneOf[i] = z;
    const placed = [];
    for (const z of names) {
      const members = zones.get(z);
      const same = (i, j) => zoneOf[i] === zoneOf[j];
      const layerOf = zoneLayers(n, members, out, inc, same);
      const b = placeBlock(members, layerOf, out, inc, x, y, same);
      placed.push({ z, members, w: b.w, h: b.h + TITLE });
    }
    pack(placed, x, y, blocks, aspect);
  }
  let minX = Infinity, minY = Infinity, maxX = -Infinity, maxY = -Infinity;
  for (let i = 0; i < n; i++) {
    if (x[i] < minX) minX = x[i];
    if (x[i] > maxX) maxX = x[i];
    if (y[i] < minY) minY = y[i];
    if (y[i] > maxY) maxY = y[i];
  }
  for (const b of blocks) {
    minX = Math.min(minX, b.x); minY = Math.min(minY, b.y);
    maxX = Math.max(maxX, b.x + b.w); maxY = Math.max(maxY, b.y + b.h);
  }
  if (!n && !blocks.length) { minX = minY = 0; maxX = maxY = 1; }
  return { x, y, blocks, minX, minY, maxX, maxY };
}

/**
 * Signed hops from the focus: callers negative, callees positive; a node met from
 * a node at layer L is at L+1 when that node calls it, L-1 when it calls that node.
 */
function focusLayers(n, out, inc, focus) {
  const layerOf = new Array(n).fill(null);
  layerOf[focus] = 0;
  const queue = [focus];
  for (let q = 0; q < queue.length; q++) {
    const u = queue[q];
    for (const v of out[u]) if (layerOf[v] === null) { layerOf[v] = layerOf[u] + 1; queue.push(v); }
    for (const v of inc[u]) if (layerOf[v] === null) { layerOf[v] = layerOf[u] - 1; queue.push(v); }
  }
  return layerOf;
}

/**
 * Layers of one zone's members by breadth-first search over the calls inside the
 * zone; members with no call inside the zone are LOOSE.
 */
function zoneLayers(n, members, out, inc, same) {
  const layerOf = new Array(n).fill(null);
  const indeg = new Map();
  let linked = 0;
  for (const i of members) {
    let d = 0;
    for (const j of inc[i]) if (same(i, j)) d++;
    indeg.set(i, d);
    const has = d > 0 || out[i].some((j) => same(i, j));
    if (!has) layerOf[i] = LOOSE;
    else linked++;
  }
  const bfs = (starts) => {
    const queue = [...starts];
    for (let q = 0; q < queue.length; q++) {
      const u = queue[q];
      for (const v of out[u]) {
        if (layerOf[v] === null && same(u, v)) { layerOf[v] = layerOf[u] + 1; queue.push(v); }
      }
    }
    return queue.length;
  };
  const roots = members.filter((i) => layerOf[i] === null && indeg.get(i) === 0);
  for (const r of roots) layerOf[r] = 0;
  let done = bfs(roots);
  while (done < linked) {
    // A cycle nobody enters from outside: start at its least-called member.
    let best = -1;
    for (const i of members) {
      if (layerOf[i] === null && (best < 0 || indeg.get(i) < indeg.get(best))) best = i;
    }
    layerOf[best] = 0;
    done += bfs([best]);
  }
  return layerOf;
}

/**
 * Positions one block's members from their layers, with (0, 0) its top-left corner;
 * answers its size. LOOSE members make a grid at the end.
 */
function placeBlock(members, layerOf, out, inc, x, y, same = () => true) {
  const layers = new Map();
  const loose = [];
  for (const i of members) {
    const l = layerOf[i];
    if (l === LOOSE) { loose.push(i); continue; }
    if (!layers.has(l)) layers.set(l, []);
    layers.get(l).push(i);
  }
  const order = [...layers.keys()].sort((a, b) => a - b);
  const linked = members.length - loose.length;
  // Rows per column: about square for the linked part of a big block.
  const rows = Math.max(8, Math.min(40, Math.ceil(Math.sqrt(linked * 2))));
  const pos = new Map();
  const sweep = (seq, near) => {
    for (const l of seq) {
      const list = layers.get(l);
      const key = new Map();
      list.forEach((i, k) => {
        let sum = 0, cnt = 0;
        for (const j of near[i]) {
          const p = pos.get(j);
          if (p !== undefined && same(i, j) && layerOf[j] !== l) { sum += p; cnt++; }
        }
        key.set(i, cnt ? sum / cnt : k / Math.max(1, list.length - 1));
      });
      list.sort((a, b) => key.get(a) - key.get(b) || a - b);
      list.forEach((i, k) => pos.set(i, k / Math.max(1, list.length - 1)));
    }
  };
  for (const l of order) layers.get(l).forEach((i, k, list) => pos.set(i, k / Math.max(1, list.length - 1)));
  sweep(order.slice(1), inc);
  sweep(order.slice(0, -1).reverse(), out);

  let cx = 0;
  let h = 0;
  for (const l of order) {
    const list = layers.get(l);
    const cols = Math.ceil(list.length / rows);
    const per = Math.ceil(list.length / cols);
    list.forEach((i, k) => {
      const c = Math.floor(k / per);
      const r = k % per;
      // Wrapped columns are staggered so their edges do not run along one line.
      x[i] = cx + c * COLUMN;
      y[i] = r * ROW + (c % 2 ? ROW / 2 : 0);
    });
    h = Math.max(h, per * ROW + (cols > 1 ? ROW / 2 : 0));
    cx += cols * COLUMN + LAYER_GAP;
  }
  if (loose.length) {
    const cols = Math.max(1, Math.ceil(Math.sqrt(loose.length / 2)));
    const per = Math.ceil(loose.length / cols);
    loose.forEach((i, k) => {
      x[i] = cx + Math.floor(k / per) * COLUMN;
      y[i] = (k % per) * ROW;
    });
    h = Math.max(h, per * ROW);
    cx += cols * COLUMN + LAYER_GAP;
  }
  return { x: 0, w: Math.max(COLUMN, cx - LAYER_GAP), h: Math.max(ROW, h) };
}

/**
 * Shelf packing of the zone blocks in name order: tries every count of blocks per
 * row (O(zones²), a few hundred zones at most) and keeps the one whose bounding box
 * fits the canvas's shape at the largest scale.
 */
function pack(placed, x, y, blocks, aspect) {
  const shelves = (perRow) => {
    let w = 0, h = 0;
    for (let i = 0; i < placed.length; i += perRow) {
      const row = placed.slice(i, i + perRow);
      w = Math.max(w, row.reduce((s, b) => s + b.w, 0) + BLOCK_GAP * (row.length - 1));
      h += row.reduce((m, b) => Math.max(m, b.h), 0) + (i ? BLOCK_GAP : 0);
    }
    return Math.min(aspect / w, 1 / h);
  };
  let best = 1, bestScale = -1;
  for (let c = 1; c <= placed.length; c++) {
    const s = shelves(c);
    if (s > bestScale * 1.0001) { best = c; bestScale = s; }
  }
  let by = 0;
  for (let i = 0; i < placed.length; i += best) {
    const row = placed.slice(i, i + best);
    let bx = 0;
    for (const b of row) {
      for (const j of b.members) { x[j] += bx; y[j] += by + TITLE; }
      blocks.push({ title: b.z, x: bx - COLUMN * 0.15, y: by, w: b.w + COLUMN * 0.3, h: b.h });
      bx += b.w + BLOCK_GAP;
    }
    by += row.reduce((m, b) => Math.max(m, b.h), 0) + BLOCK_GAP;
  }
}
