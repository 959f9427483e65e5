"""Workload identity in the dashboard, in a real browser (Debian's Chromium driven by
Playwright).

Started by tests/tests/e2e_dashboard_identity.rs with one JSON argument (the API URL,
the read token, the Chromium binary, the output folder for screenshots, the zone,
the cluster whose certificate is expiring, one whose certificate is fine, and the
caller whose SAN expectation of the expiring one fails). It checks, against the
API, each cluster row's identity state, the overview's list of certificates that
need action, each instance's identity in the cluster view, and the mismatched edge
in the graph's list form and on its canvas. Any failure raises; the exit status says whether every
check passed. Progress goes to stderr.
"""

from playwright.sync_api import sync_playwright

from pagecheck import API, SPEC, TOKEN, WAIT_MS, ZONE, api, check, log, open_page, run, shot

EXPIRING = SPEC["expiring"]
FINE = SPEC["fine"]
CALLER = SPEC["caller"]


def main():
    problems = []
    with sync_playwright() as pw:
        browser, page = open_page(pw, problems)
        page.goto(API + "/ui/")
        # ---- without the read token: the list says certificates are live data.
        page.wait_for_selector(f"[data-testid=cluster-row][data-cluster='{EXPIRING}']", timeout=WAIT_MS)
        page.wait_for_function(
            "() => document.querySelector('#certs-h').parentElement.textContent.includes('read token')",
            timeout=WAIT_MS)
        check(True, "without the read token the certificate list asks for it")

        page.click("#token-button")
        page.wait_for_selector("#token-dialog[open]")
        page.fill("#token-input", TOKEN)
        page.click("#token-form button[value=save]")

        # ---- the cluster rows: each cluster's identity as its record says it.
        for cluster in [EXPIRING, FINE, CALLER]:
            want = api(f"/clusters/{cluster}?zoneName={ZONE}")[0]["identity"]["state"]
            page.wait_for_selector(
                f"[data-testid=cluster-row][data-cluster='{cluster}'][data-identity='{want}']", timeout=WAIT_MS)
            check(True, f"the row of {cluster} shows identity {want}")
        check(api(f"/clusters/{EXPIRING}?zoneName={ZONE}")[0]["identity"]["state"] == "expiring",
              f"the API says {EXPIRING} is expiring")
        cell = page.inner_text(f"[data-testid=cluster-row][data-cluster='{EXPIRING}'] .c-identity")
        check("expiring" in cell and ("d" in cell or "h" in cell), f"the identity cell says how long is left: {cell!r}")

        # ---- the list of certificates needing action: what the API lists.
        rows = api("/certificates?state=expired&state=rotation-overdue&state=expiring")
        check(len(rows) >= 1, f"the API lists certificates needing action: {rows}")
        page.wait_for_selector(f"[data-testid=expiring-list][data-count='{len(rows)}']", timeout=WAIT_MS)
        items = page.eval_on_selector_all(
            "[data-testid=expiring-cert]", "els => els.map(e => ({...e.dataset, text: e.textContent}))")
        check([(i["cluster"], i["instance"], i["serial"]) for i in items]
              == [(r["clusterName"], r["instance"], r["serial"]) for r in rows],
              f"the list is the API's, in its order: {items}")
        check(all(i["state"] == "expiring" for i in items if i["cluster"] == EXPIRING), "its state is expiring")
        shot(page, "identity-overview.png", full=True)

        # ---- the cluster view: each instance's identity.
        page.click(f"[data-testid=cluster-row][data-cluster='{EXPIRING}']")
        record = api(f"/clusters/{EXPIRING}?zoneName={ZONE}")[0]
        for inst in record["instances"]:
            sel = f"[data-testid=instance-identity][data-instance='{inst['name']}']"
            page.wait_for_selector(f"{sel}[data-state='{inst['identity']['state']}']", timeout=WAIT_MS)
            text = page.inner_text(sel)
            for san in inst["identity"]["sans"]:
                check(san in text, f"{inst['name']}'s identity names {san}: {text!r}")
        shot(page, "identity-cluster.png", full=True)

        # ---- the graph: the caller's mismatched edge is told apart.
        page.goto(API + f"/ui/#/graph/z/{ZONE}")
        edge = f"[data-testid=graph-edge][data-source='{ZONE}/{CALLER}'][data-target='{ZONE}/{EXPIRING}']"
        page.wait_for_selector(f"{edge}[data-tls-match=false]", timeout=WAIT_MS)
        text = page.inner_text(edge)
        check("SAN mismatch" in text, f"the edge's row says SAN mismatch: {text!r}")
        # The status line counts a predicted mismatch (no traffic, not declared) with
        # the mismatches, never with the declared edges that carry no traffic.
        g = api(f"/graph?zoneName={ZONE}")
        idle = sum(1 for e in g["edges"] if e["declared"] and not e["observed"])
        status = page.inner_text(".graph-status")
        check("SAN mismatch" in status, f"the status line counts the mismatch: {status!r}")
        check((f"{idle} declared without traffic" in status) if idle else ("without traffic" not in status),
              f"the status line counts {idle} declared edges without traffic: {status!r}")
        # The canvas marks the edge too: the mark's colour, read back at its centre.
        page.wait_for_function("() => { const g = document.querySelector('#graph-canvas').graph;"
                               " return g && g.frames > 0; }", timeout=WAIT_MS)
        drawn = page.evaluate("""([source, target]) => {
          const c = document.querySelector('#graph-canvas');
          const at = c.graph.mismatchMark(source, target);
          if (!at) return null;
          const dpr = c.width / c.getBoundingClientRect().width;
          const px = c.getContext('2d').getImageData(Math.round(at.x * dpr), Math.round(at.y * dpr), 1, 1).data;
          const other = c.graph.mismatchMark(target, source);
          return {rgb: [px[0], px[1], px[2]], other};
        }""", [f"{ZONE}/{CALLER}", f"{ZONE}/{EXPIRING}"])
        check(drawn is not None, "the canvas has a SAN mismatch mark on the caller's edge")
        check(drawn["other"] is None, f"and none on an edge without a mismatch: {drawn}")
        check(abs(drawn["rgb"][0] - 0xb0) <= 8 and drawn["rgb"][1] <= 16 and abs(drawn["rgb"][2] - 0x20) <= 12,
              f"the mark is drawn in the mismatch colour #b00020: {drawn['rgb']}")
        shot(page, "identity-graph.png", full=True)

        browser.close()
    check(not problems, f"no console error, page error or failed load: {problems}")


if __name__ == "__main__":
    run(main)
