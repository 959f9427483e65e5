"""The graph view of a large mesh in a real browser (Debian's Chromium driven by Playwright).

Started by tests/tests/e2e_graph_view.rs with one JSON argument (the API URL, the
Chromium binary, the output folder for screenshots, and `nodes` / `edges`: the mesh's
counts). The mesh is registered clusters declaring calls, so many that the canvas
draws the whole mesh into pixels (graph-raster.js) and the list form's tables hold
only the rows in sight. The script checks, against `GET /graph`:

- every node is drawn where the renderer says it is, in its status's colour, with the
  whole mesh in sight (pixels) and zoomed in (the canvas's paths);
- what is under the pointer (the renderer's hit test, which looks in a spatial index)
  is what a walk over every node and edge finds, at hundreds of points, both ways;
- the list form's counts; each table holds a window of rows, yet scrolling it from
  top to bottom shows every node and every edge of the answer, in its order, with
  `aria-rowcount` counting them all.

Any failure raises; the exit status says whether every check passed.
"""

from playwright.sync_api import sync_playwright

from pagecheck import API, SPEC, WAIT_MS, api, check, log, open_page, run, shot

NODES, EDGES = SPEC["nodes"], SPEC["edges"]

# The colour of every node in sight, as drawn at its centre (device pixels; the page's
# ratio is 1), or above it when the node is big enough to carry its glyph there.
NODE_COLOURS = """
() => {
  const c = document.querySelector('#graph-canvas');
  const g = c.graph;
  const img = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
  const out = {};
  // Off the glyph a node carries once it is big enough for one.
  const r = Math.max(11 * g.k, 1.8);
  const lift = r >= 6 ? Math.round(r * 0.7) : 0;
  g.model.nodes.forEach((n) => {
    const p = g.nodePosition(n.id);
    const x = Math.floor(p.x), y = Math.floor(p.y) - lift;
    if (x < 2 || y < 2 || x >= c.width - 2 || y >= c.height - 2) return;
    const o = (y * c.width + x) * 4;
    out[n.id] = '#' + [img[o], img[o + 1], img[o + 2]].map(v => v.toString(16).padStart(2, '0')).join('');
  });
  return {pixels: g.pixels, k: g.k, colours: out};
}
"""

# The renderer's hit test against a walk over every node and edge (the rule the hit
# test keeps: the nearest node within its radius and 4 pixels, the later of two at the
# same distance; else the nearest edge within 5 pixels, the first of two), at `points`.
HITS_AGREE = """
(points) => {
  const g = document.querySelector('#graph-canvas').graph;
  const m = g.model, geo = g.geo, k = g.k;
  const seg = (px, py, ax, ay, bx, by) => {
    const dx = bx - ax, dy = by - ay, l = dx * dx + dy * dy;
    const t = Math.min(1, Math.max(0, l ? ((px - ax) * dx + (py - ay) * dy) / l : 0));
    const qx = ax + t * dx - px, qy = ay + t * dy - py;
    return qx * qx + qy * qy;
  };
  const walk = (px, py) => {
    const wx = (px - g.tx) / k, wy = (py - g.ty) / k;
    const r = Math.max(11, 1.8 / k) + 4 / k;
    let best = -1, bestD = r * r;
    for (let i = 0; i < m.nodes.length; i++) {
      const d = (m.x[i] - wx) ** 2 + (m.y[i] - wy) ** 2;
      if (d <= bestD) { bestD = d; best = i; }
    }
    if (best >= 0) return {node: best};
    const tol = 5 / k;
    let edge = -1, edgeD = tol * tol;
    for (let i = 0; i < m.edges.length; i++) {
      const o = i * 8;
      let ax = geo[o], ay = geo[o + 1];
      for (let s = 1; s <= 6; s++) {
        const t = s / 6, u = 1 - t;
        const bx = u * u * geo[o] + 2 * u * t * geo[o + 2] + t * t * geo[o + 4];
        const by = u * u * geo[o + 1] + 2 * u * t * geo[o + 3] + t * t * geo[o + 5];
        const d = seg(wx, wy, ax, ay, bx, by);
        if (d < edgeD) { edgeD = d; edge = i; }
        ax = bx; ay = by;
      }
    }
    return edge >= 0 ? {edge} : null;
  };
  const wrong = [];
  let nodes = 0, edges = 0;
  for (const [x, y] of points) {
    const want = walk(x, y), got = g.hitTest(x, y);
    if (JSON.stringify(want) !== JSON.stringify(got)) wrong.push({x, y, want, got});
    if (want && want.node !== undefined) nodes++;
    if (want && want.edge !== undefined) edges++;
  }
  return {wrong: wrong.slice(0, 5), count: wrong.length, nodes, edges};
}
"""

# Points to test: every visible node's centre and a little off it, and a grid.
POINTS = """
() => {
  const c = document.querySelector('#graph-canvas');
  const g = c.graph, w = c.clientWidth, h = c.clientHeight;
  const pts = [];
  g.model.nodes.forEach((n, i) => {
    if (i % 7) return;
    const p = g.nodePosition(n.id);
    if (p.x < 0 || p.y < 0 || p.x > w || p.y > h) return;
    pts.push([p.x, p.y], [p.x + 6, p.y + 3], [p.x - 9, p.y + 14]);
  });
  for (let x = 3; x < w; x += 23) for (let y = 5; y < h; y += 19) pts.push([x, y]);
  return pts;
}
"""

# Scrolls a table of the list form from top to bottom; answers every row's hook
# attributes in order, the most rows it held at once, and its aria-rowcount.
WALK_TABLE = """
async ([index, testid, attrs]) => {
  const box = document.querySelectorAll('.graph-list .table-scroll')[index];
  const table = box.querySelector('table');
  const frame = () => new Promise(r => requestAnimationFrame(r));
  // The rows drawn cover what the box shows (the table renders on the frame after
  // a scroll).
  const covered = () => {
    const rows = box.querySelectorAll(`[data-testid=${testid}]`);
    if (!rows.length) return false;
    const b = box.getBoundingClientRect(), head = table.tHead.getBoundingClientRect().height;
    const top = rows[0].getBoundingClientRect().top, bottom = rows[rows.length - 1].getBoundingClientRect().bottom;
    return top <= b.top + head + 1 && (bottom >= b.bottom - 1 || rows[rows.length - 1].getAttribute('aria-rowindex') === String(Number(table.getAttribute('aria-rowcount'))));
  };
  const settle = async () => { for (let i = 0; i < 60 && !covered(); i++) await frame(); };
  box.scrollTop = 0;
  await frame();
  await settle();
  const seen = new Map();
  let most = 0;
  for (;;) {
    const rows = [...box.querySelectorAll(`[data-testid=${testid}]`)];
    most = Math.max(most, rows.length);
    for (const r of rows) seen.set(Number(r.getAttribute('aria-rowindex')), attrs.map(a => r.dataset[a]));
    // The end: the box scrolls no further. (Not `scrollTop + clientHeight >=
    // scrollHeight`: with rows of fractional heights the last scroll position can
    // stop short of that by a fraction of a pixel, and the walk would never end.)
    const before = box.scrollTop;
    box.scrollTop += box.clientHeight;
    if (box.scrollTop <= before) break;
    await frame();
    await settle();
  }
  const order = [...seen.keys()].sort((a, b) => a - b);
  return {rows: order.map(i => seen.get(i)), first: order[0], last: order[order.length - 1], most,
          rowcount: table.getAttribute('aria-rowcount')};
}
"""


def node_colours(page, g, what):
    fill = {"stable": "#1c7c37", "warning": "#e3a008", "down": "#c62828"}
    drawn = page.evaluate(NODE_COLOURS)
    want = {n["id"]: fill[n["status"]] for n in g["nodes"] if n["kind"] == "cluster"}
    seen = {i: c for i, c in drawn["colours"].items() if i in want}
    wrong = {i: (c, want[i]) for i, c in seen.items() if c != want[i]}
    check(seen and not wrong,
          f"{what} (k {drawn['k']:.3f}, pixels {drawn['pixels']}): each of {len(seen)} nodes in sight "
          f"is drawn at its place in its status's colour {list(wrong.items())[:5]}")
    return drawn


def hits_agree(page, what):
    res = page.evaluate(HITS_AGREE, page.evaluate(POINTS))
    check(res["count"] == 0 and res["nodes"] > 0 and res["edges"] > 0,
          f"{what}: the hit test finds what a walk over every node and edge finds "
          f"({res['nodes']} node and {res['edges']} edge hits; wrong: {res['wrong']})")


def main():
    problems = []
    with sync_playwright() as pw:
        browser, page = open_page(pw, problems)
        g = api("/graph")
        check(len(g["nodes"]) == NODES and len(g["edges"]) == EDGES,
              f"GET /graph holds the mesh ({len(g['nodes'])} nodes, {len(g['edges'])} edges)")
        page.goto(API + "/ui/#/graph")
        page.wait_for_selector(f"[data-testid=graph][data-nodes='{NODES}'][data-edges='{EDGES}']", timeout=WAIT_MS)
        check(True, "the list form's counts are set")
        page.wait_for_function("() => !document.querySelector('#graph-canvas').graph.queued")

        # ---- the whole mesh in sight: drawn into pixels, every node at its place.
        drawn = node_colours(page, g, "whole mesh")
        check(drawn["pixels"], "with every edge in sight the canvas is drawn into pixels")
        check(len(drawn["colours"]) == NODES, f"every node is in sight ({len(drawn['colours'])} of {NODES})")
        hits_agree(page, "whole mesh")
        shot(page, "graph-large.png")

        # ---- zoomed in: the canvas's own paths.
        page.evaluate("id => document.querySelector('#graph-canvas').graph.center(id)", g["nodes"][NODES // 2]["id"])
        page.wait_for_function("() => !document.querySelector('#graph-canvas').graph.queued")
        drawn = node_colours(page, g, "zoomed in")
        check(not drawn["pixels"], "with a few edges in sight the canvas draws paths")
        hits_agree(page, "zoomed in")

        # ---- the list form: windows of rows, every row reachable by scrolling.
        page.click(".graph-list > summary")
        nodes = page.evaluate(WALK_TABLE, [0, "graph-node", ["id", "status"]])
        want = [[n["id"], n["status"]] for n in g["nodes"]]
        check(nodes["rows"] == want and nodes["first"] == 2 and nodes["last"] == NODES + 1,
              f"scrolling the node table shows every node of GET /graph in its order ({len(nodes['rows'])} rows)")
        check(nodes["most"] < 100, f"the node table held at most {nodes['most']} rows at once")
        check(nodes["rowcount"] == str(NODES + 1), f"its aria-rowcount counts every row and the header ({nodes['rowcount']})")
        edges = page.evaluate(WALK_TABLE, [1, "graph-edge", ["source", "target", "observed", "declared"]])
        want = [[e["source"], e["target"], str(e["observed"]).lower(), str(e["declared"]).lower()] for e in g["edges"]]
        check(edges["rows"] == want and edges["last"] == EDGES + 1,
              f"scrolling the edge table shows every edge of GET /graph in its order ({len(edges['rows'])} rows)")
        check(edges["most"] < 100, f"the edge table held at most {edges['most']} rows at once")
        check(edges["rowcount"] == str(EDGES + 1), f"its aria-rowcount counts every row and the header ({edges['rowcount']})")
        browser.close()

    check(not problems, f"no console errors and no failed asset loads {problems}")
    log("all checks passed")


if __name__ == "__main__":
    run(main)
