"""Measures the dashboard in Debian's Chromium (Playwright) against a running
aggregator: bytes transferred, first contentful paint, first table rows, one search
keystroke over every cluster, and the page's JavaScript heap. Run by bench/dashboard.sh.

    dashboard.py API_URL CHROMIUM [RUNS]
"""

import json
import statistics
import sys

from playwright.sync_api import sync_playwright

api, chromium = sys.argv[1], sys.argv[2]
runs = int(sys.argv[3]) if len(sys.argv) > 3 else 5

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

out = []
with sync_playwright() as pw:
    browser = pw.chromium.launch(executable_path=chromium, headless=True,
                                 args=["--no-sandbox", "--disable-dev-shm-usage", "--enable-precise-memory-info"])
    for i in range(runs):
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
