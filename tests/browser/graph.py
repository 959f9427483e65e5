"""The dependency graph view in a real browser (Debian's Chromium driven by Playwright).

Started by tests/tests/e2e_graph_view.rs with one JSON argument (the API URL, the read
token, the Chromium binary, the output folder for screenshots, the zone and the
clusters of the mesh). The mesh's traffic has stopped and the graph window is long, so
the figures hold still while the page is compared with the API. The script checks
the hooks of contract section 14 against `GET /graph` (whole, one zone, around one
cluster), clicks a node on the canvas and checks the cluster view's callers and
callees, focuses the graph from the cluster view, opens deep links afresh without
the read token (no refused call), watches a registration reach the
graph without a reload, and checks that 20 and 200 zones leave the cluster table and
the graph one click away. Any failure raises; the exit status says whether every check
passed. Progress goes to stderr.
"""

from playwright.sync_api import TimeoutError as PlaywrightTimeout
from playwright.sync_api import sync_playwright

from pagecheck import API, TOKEN, WAIT_MS, ZONE, api, check, log, open_page, run, shot


def expected(g):
    """What the hooks must say for one answer of GET /graph."""
    return {
        "nodes": {n["id"]: n["status"] for n in g["nodes"]},
        "edges": {
            f"{e['source']} {e['target']}": [e["errorRatio"], e["observed"], e["declared"]]
            for e in g["edges"]
        },
    }


# True when the page's hooks say exactly what `want` (from expected()) says: the
# counts, every node's id and status (absent for an external node, whose status is
# null), every edge's ends, error ratio (a number from 0 to 1), observed and declared.
HOOKS_MATCH = """
want => {
  const g = document.querySelector('[data-testid=graph]');
  if (!g || g.dataset.nodes === undefined) return false;
  const nodes = [...document.querySelectorAll('[data-testid=graph-node]')];
  const edges = [...document.querySelectorAll('[data-testid=graph-edge]')];
  const wantNodes = Object.entries(want.nodes), wantEdges = Object.entries(want.edges);
  if (Number(g.dataset.nodes) !== wantNodes.length || nodes.length !== wantNodes.length) return false;
  if (Number(g.dataset.edges) !== wantEdges.length || edges.length !== wantEdges.length) return false;
  for (const n of nodes) {
    if (!(n.dataset.id in want.nodes)) return false;
    const status = n.hasAttribute('data-status') ? n.dataset.status : null;
    if (status !== want.nodes[n.dataset.id]) return false;
  }
  for (const e of edges) {
    const w = want.edges[`${e.dataset.source} ${e.dataset.target}`];
    if (!w) return false;
    const ratio = Number(e.dataset.errorRatio);
    if (!(ratio >= 0 && ratio <= 1) || Math.abs(ratio - w[0]) > 1e-12) return false;
    if (!['true', 'false'].includes(e.dataset.observed) || !['true', 'false'].includes(e.dataset.declared)) return false;
    if ((e.dataset.observed === 'true') !== w[1] || (e.dataset.declared === 'true') !== w[2]) return false;
  }
  return true;
}
"""


def hooks_equal_api(page, path, what):
    """Waits until the page's hooks equal `GET path`; reads the API again when the
    catalog moved meanwhile (a status, say). Answers the API's graph."""
    for attempt in range(3):
        g = api(path)
        try:
            page.wait_for_function(HOOKS_MATCH, arg=expected(g), timeout=WAIT_MS)
            check(True, f"{what}: hooks equal GET {path} ({len(g['nodes'])} nodes, {len(g['edges'])} edges)")
            return g
        except PlaywrightTimeout:
            log(f"{what}: not equal yet (attempt {attempt + 1}), reading the API again")
    seen = page.evaluate("""() => ({
      nodes: [...document.querySelectorAll('[data-testid=graph-node]')].map(n => [n.dataset.id, n.dataset.status]),
      edges: [...document.querySelectorAll('[data-testid=graph-edge]')].map(e => ({...e.dataset})),
    })""")
    raise AssertionError(f"{what}: the hooks never matched GET {path}\napi: {expected(api(path))}\npage: {seen}")


def calls_equal_api(page, cluster):
    """The cluster view's callers and callees equal GET /graph around it, depth 1."""
    g = api(f"/graph?zoneName={ZONE}&clusterName={cluster}&depth=1")
    me = f"{ZONE}/{cluster}"
    want = {
        "caller": sorted([e["source"], e["errorRatio"], e["observed"], e["declared"]] for e in g["edges"] if e["target"] == me),
        "callee": sorted([e["target"], e["errorRatio"], e["observed"], e["declared"]] for e in g["edges"] if e["source"] == me),
    }
    page.wait_for_function(
        """want => ['caller', 'callee'].every(k => {
          const got = [...document.querySelectorAll(`[data-testid=cluster-${k}]`)]
            .map(e => [e.dataset.id, Number(e.dataset.errorRatio), e.dataset.observed === 'true', e.dataset.declared === 'true'])
            .sort((a, b) => (a[0] < b[0] ? -1 : 1));
          return JSON.stringify(got) === JSON.stringify(want[k]);
        })""",
        arg=want, timeout=WAIT_MS,
    )
    check(True, f"the cluster view of {cluster} lists callers {[c[0] for c in want['caller']]} and callees {[c[0] for c in want['callee']]} as the API")
    return want


UNLABELLED_JS = """
() => {
  const named = el => (el.labels && el.labels.length && [...el.labels].some(l => l.textContent.trim()))
    || el.getAttribute('aria-label') || el.getAttribute('aria-labelledby');
  const bad = [];
  for (const el of document.querySelectorAll('input, select, textarea, canvas')) if (!named(el)) bad.push(el.outerHTML.slice(0, 80));
  for (const el of document.querySelectorAll('button, a[href]')) if (!(el.textContent.trim() || el.getAttribute('aria-label'))) bad.push(el.outerHTML.slice(0, 80));
  return bad;
}
"""


def click_node(page, node_id):
    """Clicks a node where the canvas drew it (the canvas's renderer says where)."""
    page.evaluate("id => document.querySelector('#graph-canvas').graph.center(id)", node_id)
    page.wait_for_function("() => !document.querySelector('#graph-canvas').graph.queued")
    pos = page.evaluate("id => document.querySelector('#graph-canvas').graph.nodePosition(id)", node_id)
    box = page.locator("#graph-canvas").bounding_box()
    page.mouse.move(box["x"] + pos["x"], box["y"] + pos["y"])
    page.wait_for_selector(".graph-tip:not([hidden])", timeout=WAIT_MS)
    tip = page.inner_text(".graph-tip")
    check(node_id.split("/", 1)[1] in tip, f"hovering {node_id} shows its tooltip ({tip!r})")
    page.mouse.click(box["x"] + pos["x"], box["y"] + pos["y"])


def register_zones(total):
    have = {z["zoneName"] for z in api("/zones")}
    for i in range(total):
        if len(have) >= total:
            break
        name = f"zz-{i:03d}"
        if name not in have:
            api("/zones", "POST", body={"zoneName": name, "serverAddress": "control.local:50000"})
            have.add(name)


def main():
    problems = []

    with sync_playwright() as pw:
        # No 403 either: a page that knows it lacks the read token asks for it
        # rather than calling.
        browser, page = open_page(pw, problems)

        # ---- deep links opened afresh (a reload) wait for the records before reading
        # live data: without the read token they ask for it rather than call for a 403.
        page.goto(API + f"/ui/#/c/{ZONE}/svc-a")
        page.wait_for_selector("[data-testid=cluster-view][data-cluster=svc-a]", timeout=WAIT_MS)
        page.wait_for_selector("#calls-h ~ div >> text=need the read token", timeout=WAIT_MS)
        page.wait_for_selector("text=hidden without the read token", timeout=WAIT_MS)
        check(True, "a reloaded cluster view asks for the read token for its calls and history")
        page.goto(API + "/ui/#/graph")
        page.wait_for_selector("#token-dialog[open]", timeout=WAIT_MS)
        page.click("#token-form button[value=cancel]")
        page.wait_for_selector("#token-dialog:not([open])", state="attached", timeout=WAIT_MS)
        check(True, "a reloaded graph view asks for the read token")

        # ---- the navigation leads to the graph; without the read token it asks for it.
        page.goto(API + "/ui/")
        page.wait_for_selector("[data-testid=cluster-row]", timeout=WAIT_MS)
        # Without the read token the cluster view's calls say what they need.
        page.click("[data-testid=cluster-row][data-cluster=svc-a]")
        page.wait_for_selector("[data-testid=cluster-view][data-cluster=svc-a]", timeout=WAIT_MS)
        page.wait_for_selector("#calls-h ~ div >> text=need the read token", timeout=WAIT_MS)
        check(True, "without the read token the calls ask for it")
        page.click("[data-testid=nav-graph]")
        page.wait_for_selector("#token-dialog[open]", timeout=WAIT_MS)
        check("read token" in page.inner_text("#token-reason"), "the graph without the read token opens the token dialog saying why")
        page.fill("#token-input", TOKEN)
        page.click("#token-form button[value=save]")
        page.wait_for_selector("[data-testid=graph][data-nodes]", timeout=WAIT_MS)
        check(page.url.endswith("#/graph"), f"nav-graph leads to #/graph ({page.url})")
        check(page.get_attribute("[data-testid=nav-graph]", "aria-current") == "page", "the navigation marks the graph as the current view")

        # ---- the whole graph: hooks equal the API, and what the mesh is known to hold.
        g = hooks_equal_api(page, "/graph", "whole mesh")
        edges = {(e["source"], e["target"]): e for e in g["edges"]}
        z = lambda c: f"{ZONE}/{c}"
        failing = edges[(z("svc-a"), z("svc-b"))]
        check(failing["observed"] and failing["declared"] and 0 < failing["errorRatio"] <= 1,
              f"svc-a -> svc-b is observed, declared and failing ({failing['errorRatio']})")
        check(edges[(z("edge"), z("svc-a"))]["observed"] and not edges[(z("edge"), z("svc-a"))]["declared"],
              "edge -> svc-a is observed and undeclared")
        check(not edges[(z("svc-a"), z("ghost"))]["observed"] and edges[(z("svc-a"), z("ghost"))]["declared"],
              "svc-a -> ghost is declared without traffic")
        check(any(n["kind"] == "external" for n in g["nodes"]), "an external node is in the graph")
        check(page.get_attribute(f"[data-testid=graph-node][data-id='{z('external:external-api')}']", "data-status") is None,
              "the external node's data-status is absent, as its status is null")
        row = page.inner_text(f"[data-testid=graph-edge][data-source='{z('svc-a')}'][data-target='{z('svc-b')}']")
        check("%" in row, f"the failing edge's row shows its error ratio ({row!r})")

        # ---- the canvas drew every node; the legend names the encodings.
        drawn = page.evaluate("() => performance.getEntriesByName('meshcat-graph-drawn').map(m => m.detail)")
        check(drawn and drawn[-1]["nodes"] == len(g["nodes"]), f"the first frame drew every node ({drawn})")
        png = page.locator("#graph-canvas").screenshot()
        check(len(png) > 5000, f"the canvas is not blank ({len(png)} bytes of PNG)")
        legend = page.inner_text(".legend")
        for word in ("stable", "warning", "down", "external", "declared", "no traffic", "nobody declared"):
            check(word in legend, f"the legend explains {word!r}")
        # ---- failing is the aggregator's threshold, read from the answer, never the page's own.
        warning = g.get("errorRatioWarning")
        check(isinstance(warning, (int, float)) and 0 <= warning <= 1,
              f"the graph answer carries the error-ratio warning ({warning!r})")
        words = f"above {round(warning * 100, 1):g} %"
        check(words in legend, f"the legend names the aggregator's threshold ({words!r} in {legend!r})")
        for (source, target), e in edges.items():
            if not e["observed"]:
                continue
            want = "ratio-bad" if e["errorRatio"] > warning else "ratio-warn" if e["errorRatio"] > 0 else "ratio-ok"
            cls = page.get_attribute(
                f"[data-testid=graph-edge][data-source='{source}'][data-target='{target}'] td.num", "class")
            check(want in (cls or ""), f"{source} -> {target} at {e['errorRatio']} is drawn {want} ({cls!r})")
        bad = page.evaluate(UNLABELLED_JS)
        check(not bad, f"every control of the graph view has a label or name {bad}")
        shot(page, "graph.png")

        # ---- a click on a node opens its cluster view, with its callers and callees.
        page.evaluate("() => { window.__sameDocument = true; }")
        click_node(page, z("svc-a"))
        page.wait_for_selector(f"[data-testid=cluster-view][data-cluster=svc-a][data-zone='{ZONE}']", timeout=WAIT_MS)
        check(page.url.endswith(f"#/c/{ZONE}/svc-a"), "a click on svc-a on the canvas opens its cluster view")
        calls = calls_equal_api(page, "svc-a")
        check([c[0] for c in calls["caller"]] == [z("edge")], "svc-a is called by edge")
        check({c[0] for c in calls["callee"]} >= {z("svc-b"), z("ghost"), z("external:external-api")},
              "svc-a calls svc-b, ghost and the external service")
        page.locator("#calls-h").scroll_into_view_if_needed()
        shot(page, "cluster-calls.png")

        # ---- the graph around svc-a, opened from its cluster view with a depth.
        page.select_option("#calls-depth", "2")
        page.click("[data-testid=cluster-graph]")
        page.wait_for_url(f"**/ui/#/graph/c/{ZONE}/svc-a/2", timeout=WAIT_MS)
        hooks_equal_api(page, f"/graph?zoneName={ZONE}&clusterName=svc-a&depth=2", "around svc-a, depth 2")
        x = {c: page.evaluate("id => document.querySelector('#graph-canvas').graph.nodePosition(id).x", z(c))
             for c in ("edge", "svc-a", "svc-b")}
        check(x["edge"] < x["svc-a"] < x["svc-b"], f"around svc-a its caller stands left and its callee right ({x})")
        shot(page, "graph-focus.png")
        page.select_option("#graph-depth", "1")
        page.wait_for_url(f"**/ui/#/graph/c/{ZONE}/svc-a/1", timeout=WAIT_MS)
        hooks_equal_api(page, f"/graph?zoneName={ZONE}&clusterName=svc-a&depth=1", "around svc-a, depth 1")

        # ---- the zone filter.
        page.click("[data-testid=nav-graph]")
        page.wait_for_url("**/ui/#/graph", timeout=WAIT_MS)
        hooks_equal_api(page, "/graph", "whole mesh again")
        page.focus("#graph-zone")
        page.select_option("#graph-zone", ZONE)
        page.wait_for_url(f"**/ui/#/graph/z/{ZONE}", timeout=WAIT_MS)
        hooks_equal_api(page, f"/graph?zoneName={ZONE}", f"zone {ZONE}")
        focused = page.evaluate("() => document.activeElement.id")
        check(focused == "graph-zone", f"the zone selector keeps the focus in the view built anew ({focused!r})")

        # ---- live: a registration that declares a call reaches the graph without a reload.
        page.select_option("#graph-zone", "")
        page.wait_for_url("**/ui/#/graph", timeout=WAIT_MS)
        api("/zones", "POST", body={"zoneName": "zone-h", "serverAddress": "control.local:50000"})
        api("/clusters", "POST", body={"zoneName": "zone-h", "clusterName": "reports", "name": "Reports",
                                       "owner": "team-h", "dependencies": [f"{ZONE}/svc-b"]})
        hooks_equal_api(page, "/graph", "after zone-h/reports declared a call to svc-b")
        check(page.evaluate("() => window.__sameDocument === true"), "the new edge came without a reload")
        check(page.query_selector(f"[data-testid=graph-edge][data-source='zone-h/reports'][data-target='{z('svc-b')}'][data-observed=false][data-declared=true]") is not None,
              "the declared cross-zone call is a dashed (declared, not observed) edge")

        # ---- the overview with 20, then 200 zones: the cluster table and the graph stay near.
        for total in (20, 200):
            register_zones(total)
            page.click("[data-testid=nav-overview]")
            page.wait_for_selector("[data-testid=cluster-row]", timeout=WAIT_MS)
            page.wait_for_function("n => document.querySelectorAll('#zones tr[data-zone]').length === n", arg=total, timeout=WAIT_MS)
            top = page.evaluate("() => document.querySelector('#clusters-h').getBoundingClientRect().top")
            check(top < 800, f"with {total} zones the cluster table starts on the first screen (at {top:.0f} px)")
            check(page.is_visible("[data-testid=nav-graph]"), "the graph is one click away")
            check(not page.evaluate("() => document.querySelector('#zones-box').open"), f"{total} zones start as one closed line")
            summary = page.inner_text("#zones-box summary")
            check(f"{total} zones" in summary, f"the zones line counts them ({summary!r})")
        page.click("#zones-box summary")
        height = page.evaluate("() => document.querySelector('.zones-scroll').getBoundingClientRect().height")
        check(height < 400, f"200 zones open in a scrolling table {height:.0f} px tall")
        shot(page, "overview-200-zones.png")

        # ---- phone width: the graph view without sideways scrolling.
        page.click("[data-testid=nav-graph]")
        page.wait_for_selector("[data-testid=graph][data-nodes]", timeout=WAIT_MS)
        page.set_viewport_size({"width": 390, "height": 844})
        page.wait_for_function("() => document.documentElement.scrollWidth <= 390")
        check(True, "no sideways scrolling at 390 px (graph view)")
        shot(page, "phone-graph.png")

        browser.close()

    check(not problems, f"no console errors and no failed asset loads {problems}")
    log("all checks passed")


if __name__ == "__main__":
    run(main)
