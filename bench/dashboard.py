"""Measures the dashboard in Debian's Chromium (Playwright) against a running
aggregator. Run by bench/dashboard.sh.

    dashboard.py API_URL CHROMIUM [RUNS]
        the overview: bytes transferred, first contentful paint, first table rows,
        one search keystroke over every cluster, and the page's JavaScript heap.

    dashboard.py --graph API_URL CHROMIUM [RUNS]
        the graph view on a mesh of GRAPH_NODES clusters (1,000) in GRAPH_ZONES zones
        (5), each declaring 3 others (3,000 edges), registered here unless the
        aggregator already holds it (writes need no token: --allow-anonymous-writes).
        Measures the first frame (from navigation to `/ui/#/graph` to the page's
        `meshcat-graph-drawn` mark, set after the first canvas frame with every node)
        and the frame rate while drags and wheel notches go to the canvas for 3 s
        (frames the page actually drew, over the time spent), then the same input for
        3 s more under Chromium's trace: the page's main thread per frame drawn, as
        the CPU time its thread spent (less moved by other work on the machine than
        the frame rate) and as wall time. Its last line reads
        `graph view: first frame <ms> ms, <fps> fps, <nodes> nodes, <edges> edges`.
        With GRAPH_UI_DIR set, the page's files are read from that folder (see below).
"""

import base64
import json
import math
import os
import statistics
import sys
import time
import urllib.request

from playwright.sync_api import sync_playwright

args = sys.argv[1:]
graph_mode = "--graph" in args
args = [a for a in args if a != "--graph"]
api, chromium = args[0], args[1]
runs = int(args[2]) if len(args) > 2 else 5

MEASURE = """
() => {
  const nav = performance.getEntriesByType('navigation')[0];
  const res = performance.getEntriesByType('resource');
  const fcp = performance.getEntriesByName('first-contentful-paint')[0];
  const rows = performance.getEntriesByName('meshcat-rows')[0];
  const assets = res.filter(r => r.name.includes('/ui/'));
  const data = res.filter(r => !r.name.includes('/ui/'));
  const sum = (a, k) => a.reduce((s, r) => s + r[k], 0);
  return {
    fcp: fcp ? fcp.startTime : null,
    rows: rows ? rows.startTime : null,
    pageBytes: nav.transferSize + sum(assets, 'transferSize'),
    pageBytesRaw: nav.decodedBodySize + sum(assets, 'decodedBodySize'),
    dataBytes: sum(data, 'transferSize'),
    dataBytesRaw: sum(data, 'decodedBodySize'),
    heap: performance.memory ? performance.memory.usedJSHeapSize : null,
    rendered: document.querySelectorAll('[data-testid=cluster-row]').length,
  };
}
"""

SEARCH = """
() => {
  const el = document.querySelector('[data-testid=search]');
  const t = performance.now();
  el.value = 'team-7';
  el.dispatchEvent(new Event('input'));
  const one = performance.now() - t;
  el.value = '';
  el.dispatchEvent(new Event('input'));
  return one;
}
"""

LAUNCH = ["--no-sandbox", "--disable-dev-shm-usage", "--enable-precise-memory-info"] + os.environ.get("CHROMIUM_FLAGS", "").split()


def overview():
    out = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, headless=True, args=LAUNCH)
        for _ in range(runs):
            ctx = browser.new_context(viewport={"width": 1280, "height": 800})
            page = ctx.new_page()
            page.goto(api + "/ui/")
            page.wait_for_selector("[data-testid=cluster-row]", timeout=60_000)
            page.wait_for_function("() => performance.getEntriesByName('meshcat-rows').length > 0")
            m = page.evaluate(MEASURE)
            m["search"] = page.evaluate(SEARCH)
            out.append(m)
            ctx.close()
        browser.close()

    med = lambda k: statistics.median(m[k] for m in out)
    print(json.dumps(out[-1]))
    print(f"runs: {runs} (median)")
    print(f"page (html, js, css, icon): {out[-1]['pageBytes']} bytes transferred, {out[-1]['pageBytesRaw']} raw")
    print(f"catalog data read at load: {out[-1]['dataBytes']} bytes transferred, {out[-1]['dataBytesRaw']} raw")
    print(f"first contentful paint: {med('fcp'):.0f} ms")
    print(f"first table rows: {med('rows'):.0f} ms ({out[-1]['rendered']} rows in the DOM)")
    print(f"one search keystroke over every cluster: {med('search'):.1f} ms")
    if out[-1]["heap"]:
        print(f"JS heap after load: {med('heap') / 1048576:.1f} MiB")


# ---------------------------------------------------------------- the graph view

GRAPH_NODES = int(os.environ.get("GRAPH_NODES", "1000"))
GRAPH_ZONES = int(os.environ.get("GRAPH_ZONES", "5"))
# Each cluster declares the clusters this far after it: mostly its own zone, some
# across zones, no two the same.
OFFSETS = (1, 7, 31)


def http(method, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(api + path, method=method, data=data)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def register_mesh():
    g = http("GET", "/graph")
    if len(g["nodes"]) >= GRAPH_NODES:
        return g
    zones = [f"mesh-{z:02d}" for z in range(GRAPH_ZONES)]
    for z in zones:
        http("POST", "/zones", {"zoneName": z, "serverAddress": "control.local:50000"})
    zone_of = lambda i: zones[i * GRAPH_ZONES // GRAPH_NODES]
    name = lambda i: f"svc-{i:04d}"
    records = []
    for i in range(GRAPH_NODES):
        deps = []
        for off in OFFSETS:
            j = (i + off) % GRAPH_NODES
            deps.append(name(j) if zone_of(j) == zone_of(i) else f"{zone_of(j)}/{name(j)}")
        records.append({"zoneName": zone_of(i), "clusterName": name(i), "name": f"Service {i}",
                        "owner": f"team-{i % 9}", "dependencies": deps})
    for k in range(0, len(records), 500):
        http("POST", "/clusters", records[k:k + 500])
    return http("GET", "/graph")


FIRST_FRAME = """
() => {
  const m = performance.getEntriesByName('meshcat-graph-drawn')[0];
  const g = document.querySelector('#graph-canvas').graph;
  return {at: m.startTime, nodes: m.detail.nodes, edges: m.detail.edges, drawMs: g.lastDrawMs,
          frames: g.frames};
}
"""

# Input at three events per animation frame (a mouse reports at 125 Hz and more), for
# `seconds`: drags in circles, then wheel notches that zoom in to where labels show
# and back out, over and over. The events are dispatched in the page: input sent
# through Playwright waits for each event's round trip (about 80 ms here), which
# would measure the driver, not the page. Answers the frames the page drew, the time
# and the slowest draw.
PAN_AND_ZOOM = """
(seconds) => new Promise((resolve) => {
  const c = document.querySelector('#graph-canvas');
  const g = c.graph;
  const r = c.getBoundingClientRect();
  const cx = r.left + r.width / 2, cy = r.top + r.height / 2;
  const opts = (x, y) => ({pointerId: 7, pointerType: 'mouse', isPrimary: true, button: 0, buttons: 1,
                           clientX: x, clientY: y, bubbles: true, cancelable: true});
  const f0 = g.frames, t0 = performance.now();
  let i = 0, slowest = 0, seen = g.frames;
  const tick = () => {
    if (g.frames !== seen) { seen = g.frames; slowest = Math.max(slowest, g.lastDrawMs); }
    const t = performance.now() - t0;
    if (t >= seconds * 1000) {
      resolve({frames: g.frames - f0, ms: performance.now() - t0, slowest});
      return;
    }
    for (let k = 0; k < 3; k++, i++) {
      const phase = i % 240;
      if (phase < 120) {
        const a = phase / 120 * 2 * Math.PI;
        const x = cx + 120 * Math.cos(a), y = cy + 80 * Math.sin(a);
        if (phase === 0) c.dispatchEvent(new PointerEvent('pointerdown', opts(x, y)));
        c.dispatchEvent(new PointerEvent('pointermove', opts(x, y)));
        if (phase === 119) c.dispatchEvent(new PointerEvent('pointerup', opts(x, y)));
      } else {
        const dy = phase < 180 ? -40 : 40;
        c.dispatchEvent(new WheelEvent('wheel', {deltaY: dy, clientX: cx, clientY: cy, bubbles: true, cancelable: true}));
      }
    }
    requestAnimationFrame(tick);
  };
  requestAnimationFrame(tick);
})
"""


# The renderer's main thread in a Chromium trace: its top-level tasks' wall and CPU
# time (`dur`, `tdur`), and the CPU time of what runs in them by kind.
TRACE_CATEGORIES = ["devtools.timeline", "disabled-by-default-devtools.timeline", "v8.execute", "blink", "cc", "toplevel"]
TRACE_KINDS = {"FireAnimationFrame": "animation frames (the draw)", "Commit": "commit (canvas raster)",
               "EventDispatch": "input events", "MinorGC": "GC", "MajorGC": "GC", "Paint": "paint"}


def traced(page, ctx, script, arg):
    """Runs `script` in the page under a trace; answers its result and the main
    thread's wall and CPU milliseconds, in all and by kind."""
    cdp = ctx.new_cdp_session(page)
    cdp.send("Tracing.start", {"traceConfig": {"includedCategories": TRACE_CATEGORIES}, "transferMode": "ReturnAsStream"})
    result = page.evaluate(script, arg)
    done = {}
    cdp.on("Tracing.tracingComplete", lambda e: done.setdefault("stream", e["stream"]))
    cdp.send("Tracing.end")
    while "stream" not in done:
        page.wait_for_timeout(50)
    chunks = []
    while True:
        r = cdp.send("IO.read", {"handle": done["stream"], "size": 1 << 22})
        chunks.append(base64.b64decode(r["data"]) if r.get("base64Encoded") else r["data"].encode())
        if r.get("eof"):
            break
    cdp.send("IO.close", {"handle": done["stream"]})
    trace = json.loads(b"".join(chunks))
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    main = {(e["pid"], e["tid"]) for e in events
            if e.get("ph") == "M" and e.get("name") == "thread_name" and e["args"].get("name") == "CrRendererMain"}
    wall = cpu = 0.0
    kinds = {}
    for e in events:
        if e.get("ph") != "X" or (e["pid"], e["tid"]) not in main:
            continue
        if e["name"] == "ThreadControllerImpl::RunTask":
            wall += e["dur"] / 1000
            cpu += e.get("tdur", 0) / 1000
        kind = TRACE_KINDS.get(e["name"])
        if kind:
            kinds[kind] = kinds.get(kind, 0) + e.get("tdur", 0) / 1000
    return result, {"wall": wall, "cpu": cpu, "kinds": kinds}


# GRAPH_UI_DIR: a folder of the page's files (aggregator/ui of some build) served to
# the browser in place of the aggregator's, through Playwright's request routing, so
# two builds' pages are measured against the same aggregator. The routing costs the
# page's files their own time: compare a folder only with another folder.
GRAPH_UI_DIR = os.environ.get("GRAPH_UI_DIR")
UI_TYPES = {"html": "text/html; charset=utf-8", "js": "text/javascript; charset=utf-8",
            "css": "text/css; charset=utf-8", "svg": "image/svg+xml"}


def serve_ui(route):
    name = route.request.url.split("/ui/", 1)[1].split("#")[0].split("?")[0] or "index.html"
    path = os.path.join(GRAPH_UI_DIR, name)
    if "/" in name or not os.path.isfile(path):
        route.continue_()
        return
    with open(path, "rb") as f:
        route.fulfill(status=200, body=f.read(), headers={"content-type": UI_TYPES[name.rsplit(".", 1)[-1]]})


def graph():
    g = register_mesh()
    nodes, edges = len(g["nodes"]), len(g["edges"])
    print(f"mesh: {nodes} nodes, {edges} edges in GET /graph ({len(json.dumps(g))} bytes of JSON)")
    out = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, headless=True, args=LAUNCH)
        for _ in range(runs):
            ctx = browser.new_context(viewport={"width": 1280, "height": 800})
            if GRAPH_UI_DIR:
                ctx.route("**/ui/**", serve_ui)
            page = ctx.new_page()
            page.goto(api + "/ui/#/graph")
            page.wait_for_function("() => performance.getEntriesByName('meshcat-graph-drawn').length > 0",
                                   timeout=60_000)
            m = page.evaluate(FIRST_FRAME)
            page.wait_for_selector(f"[data-testid=graph][data-edges='{edges}']", timeout=60_000)
            m["list"] = page.evaluate("() => performance.now()")
            p = page.evaluate(PAN_AND_ZOOM, 3)
            m["fps"] = p["frames"] / (p["ms"] / 1000)
            m["frames"] = p["frames"]
            m["slowest"] = p["slowest"]
            q, main = traced(page, ctx, PAN_AND_ZOOM, 3)
            frames = max(1, q["frames"])
            m["mainCpu"] = main["cpu"] / frames
            m["mainWall"] = main["wall"] / frames
            m["mainKinds"] = {k: v / frames for k, v in main["kinds"].items()}
            m["page"] = page.evaluate(MEASURE)
            out.append(m)
            ctx.close()
        browser.close()
    med = lambda k: statistics.median(m[k] for m in out)
    print(json.dumps(out[-1]))
    print(f"runs: {runs} (median)")
    print(f"page (html, js, css, icon): {out[-1]['page']['pageBytes']} bytes transferred, "
          f"{out[-1]['page']['pageBytesRaw']} raw")
    print(f"data read by the page: {out[-1]['page']['dataBytes']} bytes transferred, "
          f"{out[-1]['page']['dataBytesRaw']} raw")
    print(f"first frame with every node (from navigation): {med('at'):.0f} ms, "
          f"one full draw {med('drawMs'):.1f} ms")
    print(f"list form holding the answer (its counts set): {med('list'):.0f} ms")
    print(f"pan and zoom for 3 s: {med('fps'):.1f} frames/s drawn ({out[-1]['frames']} frames in the last run), "
          f"slowest draw {med('slowest'):.1f} ms")
    kinds = ", ".join(f"{k} {v:.1f}" for k, v in sorted(out[-1]["mainKinds"].items(), key=lambda kv: -kv[1]))
    print(f"main thread per frame drawn while panning and zooming (traced): {med('mainCpu'):.1f} ms CPU, "
          f"{med('mainWall'):.1f} ms wall (last run's CPU: {kinds})")
    print(f"graph view: first frame {med('at'):.0f} ms, {med('fps'):.0f} fps, {out[-1]['nodes']} nodes, "
          f"{out[-1]['edges']} edges")


if __name__ == "__main__":
    graph() if graph_mode else overview()
