"""The zone's control server and the sidecars' sync in the dashboard, in a real
browser (Debian's Chromium driven by Playwright).

Started by tests/tests/e2e_dashboard_control.rs with one JSON argument (the API URL,
the read token, the Chromium binary, the output folder for screenshots, the zone,
the cluster and instance an agent reports, a cluster only the control server
declares, the control server's address, and the endpoint the held sidecar will
miss). It checks the page's `zone-control`, `instance-sync`, `instance-source` and
`control-plane` hooks against the API, asks the Rust side to hold the sidecar on its
snapshot while an endpoint moves (prints `HOLD`, waits for a line on stdin) and
watches the sidecar turn `stale` without a reload, then to stop the control server
(`STOP`) and watches the zone turn `unreachable`. Any failure raises; the exit status
says whether every check passed. Progress goes to stderr.
"""

import sys
import time

from playwright.sync_api import sync_playwright

from pagecheck import API, SPEC, TOKEN, WAIT_MS, ZONE, api, check, log, open_page, run, shot

CLUSTER = SPEC["cluster"]
INSTANCE = SPEC["instance"]
DECLARED = SPEC["declared"]
SERVER = SPEC["serverAddress"]
MOVED = SPEC["moved"]
# A sync change reaches the page through the event stream, well before the
# cluster view's own reads every 15 s.
LIVE_MS = 4_000

ZONE_CONTROL = f"[data-testid=zone-control][data-zone='{ZONE}']"
SYNC = f"[data-testid=instance-sync][data-instance='{INSTANCE}']"


def ask(what):
    print(what, flush=True)
    line = sys.stdin.readline().strip()
    check(bool(line), f"the test answered {what} ({line!r})")


def controls(page):
    return page.eval_on_selector_all(
        ZONE_CONTROL,
        "els => els.map(e => ({state: e.dataset.state, title: e.title, text: e.textContent,"
        " shown: !!(e.offsetWidth || e.offsetHeight)}))",
    )


def sync_proxy():
    body = api(f"/sync?zoneName={ZONE}&clusterName={CLUSTER}")
    return next((p for p in body["proxies"] if p["instance"] == INSTANCE), None)


def api_until(what, fn, timeout_s=30):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        v = fn()
        if v:
            return v
        time.sleep(0.1)
    raise AssertionError(f"the API never showed {what}")


def main():
    problems = []
    live_calls = []

    with sync_playwright() as pw:
        browser, page = open_page(pw, problems)
        page.on(
            "request",
            lambda r: live_calls.append(r.url)
            if r.url.startswith(API + "/sync") or (r.url.startswith(API + "/zones/") and "/control" in r.url)
            else None,
        )

        # ---- without the read token: the states say they are hidden, nothing is asked.
        page.goto(API + "/ui/")
        page.wait_for_selector(f"[data-testid=cluster-row][data-cluster='{CLUSTER}']", timeout=WAIT_MS)
        page.wait_for_selector("#notice:not([hidden])", timeout=WAIT_MS)
        page.wait_for_selector(f"{ZONE_CONTROL}[data-state='']", timeout=WAIT_MS)
        page.wait_for_function(
            "sel => (document.querySelector(sel).textContent || '').includes('hidden')",
            arg=ZONE_CONTROL, timeout=WAIT_MS,
        )
        check(not live_calls, f"without the read token the page asks for no control or sync state {live_calls}")
        shot(page, "control-hidden.png")

        # ---- the token: the zone's control state, as the API says.
        page.click("#token-button")
        page.wait_for_selector("#token-dialog[open]")
        page.fill("#token-input", TOKEN)
        page.click("#token-form button[value=save]")
        page.wait_for_selector(f"{ZONE_CONTROL}[data-state=connected]", timeout=WAIT_MS)
        control = api(f"/zones/{ZONE}/control")
        check(control["state"] == "connected", "the API says the zone is connected")
        [c] = controls(page)
        check(c["shown"] and "connected" in c["text"], f"the zones table shows the word connected ({c['text']!r})")
        check(SERVER in c["title"], f"its tooltip names the control server ({c['title']!r})")
        shot(page, "control-overview.png")

        # ---- the cluster view: the sidecar synced, from an agent; the zone's state.
        page.click(f"[data-testid=cluster-row][data-cluster='{CLUSTER}']")
        page.wait_for_selector(f"[data-testid=cluster-view][data-cluster='{CLUSTER}']", timeout=WAIT_MS)
        page.wait_for_selector(f"{SYNC}[data-state=synced]", timeout=WAIT_MS)
        check(sync_proxy()["state"] == "synced", "the API says the sidecar is synced")
        source = page.get_attribute(f"[data-testid=instance-source][data-instance='{INSTANCE}']", "data-source")
        check(source == "agent", f"the instance's source is its agent ({source})")
        cs = controls(page)
        check(len(cs) == 1 and cs[0]["shown"] and cs[0]["state"] == "connected",
              f"the cluster view shows the zone's control state, the one hook of the zone {cs}")
        record = api(f"/clusters/{CLUSTER}?zoneName={ZONE}")[0]
        cp = page.eval_on_selector("[data-testid=cluster-view] [data-testid=control-plane]", "e => ({...e.dataset})")
        check(cp["declared"] == str(record["controlPlane"]["declared"]).lower()
              and int(cp["endpoints"]) == record["controlPlane"]["endpoints"]
              and int(cp["healthyEndpoints"]) == record["controlPlane"]["healthyEndpoints"],
              f"the cluster's controlPlane is the API's ({cp} vs {record['controlPlane']})")
        shot(page, "control-cluster.png", full=True)

        # ---- a cluster only the control server declares: its endpoints, no sidecar.
        page.evaluate(f"() => {{ location.hash = '#/c/{ZONE}/{DECLARED}'; }}")
        page.wait_for_selector(f"[data-testid=cluster-view][data-cluster='{DECLARED}']", timeout=WAIT_MS)
        declared = api(f"/clusters/{DECLARED}?zoneName={ZONE}")[0]
        names = sorted(i["name"] for i in declared["instances"])
        page.wait_for_function(
            "n => document.querySelectorAll('[data-testid=instance-source][data-source=control-server]').length === n",
            arg=len(names), timeout=WAIT_MS,
        )
        shown = sorted(page.eval_on_selector_all("[data-testid=instance-row]", "els => els.map(e => e.dataset.instance)"))
        check(shown == names, f"the declared cluster lists the control server's endpoints ({shown})")
        check(page.query_selector("[data-testid=cluster-view] [data-testid=instance-sync]") is None,
              "endpoints of the control server carry no sync state")
        cp = page.eval_on_selector("[data-testid=cluster-view] [data-testid=control-plane]", "e => ({...e.dataset})")
        check(cp["declared"] == "true" and int(cp["endpoints"]) == declared["controlPlane"]["endpoints"],
              f"the declared cluster's controlPlane is the API's ({cp})")

        # ---- the sidecar held on its snapshot while an endpoint moves: stale, live.
        page.evaluate(f"() => {{ location.hash = '#/c/{ZONE}/{CLUSTER}'; }}")
        page.wait_for_selector(f"{SYNC}[data-state=synced]", timeout=WAIT_MS)
        page.evaluate("() => { window.__sameDocument = true; }")
        ask("HOLD")
        stale = api_until("the sidecar stale", lambda: (lambda p: p if p and p["state"] == "stale" else None)(sync_proxy()))
        page.wait_for_selector(f"{SYNC}[data-state=stale]", timeout=LIVE_MS)
        check(page.evaluate("() => window.__sameDocument === true"), "the sidecar turned stale without a reload")
        title = page.get_attribute(SYNC, "title")
        check(stale["detail"]["text"] in title, f"the badge's tooltip is the API's detail ({title!r})")
        detail = page.inner_text(f"[data-testid=instance-row][data-instance='{INSTANCE}'] .sync-detail")
        check(MOVED in detail, f"the detail is shown beside the stale sidecar, naming {MOVED} ({detail!r})")
        shot(page, "control-stale.png", full=True)

        # ---- the control server stops: the zone unreachable, with the reason.
        ask("STOP")
        page.wait_for_selector(f"{ZONE_CONTROL}[data-state=unreachable]", timeout=WAIT_MS)
        control = api(f"/zones/{ZONE}/control")
        check(control["state"] == "unreachable" and control["error"], f"the API says unreachable: {control['error']!r}")
        [c] = controls(page)
        check("unreachable" in c["text"] and SERVER in c["title"], f"the badge says unreachable, its tooltip the server ({c})")
        page.wait_for_selector(f"{SYNC}[data-state=disconnected]", timeout=WAIT_MS)
        check(page.evaluate("() => window.__sameDocument === true"), "the zone and the sidecar moved without a reload")
        shot(page, "control-unreachable.png", full=True)

        # ---- back on the overview, the zones table says so too.
        page.click("a.back")
        page.wait_for_selector(f"#zones {ZONE_CONTROL}[data-state=unreachable]", timeout=WAIT_MS)
        check(len(controls(page)) == 1, "one control-state hook for the zone on the overview")

        # ---- phone width: no sideways scrolling.
        page.set_viewport_size({"width": 390, "height": 844})
        page.wait_for_function("() => document.documentElement.scrollWidth <= 390")
        check(True, "no sideways scrolling at 390 px (overview)")
        page.click(f"[data-testid=cluster-row][data-cluster='{CLUSTER}']")
        page.wait_for_selector(f"{SYNC}[data-state]", timeout=WAIT_MS)
        page.wait_for_function("() => document.documentElement.scrollWidth <= 390")
        check(True, "no sideways scrolling at 390 px (cluster view)")
        shot(page, "control-phone.png", full=True)

        browser.close()

    check(not problems, f"no console errors and no failed asset loads {problems}")
    log("all checks passed")


if __name__ == "__main__":
    run(main)
