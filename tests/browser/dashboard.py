"""The dashboard in a real browser (Debian's Chromium driven by Playwright).

Started by tests/tests/e2e_dashboard.rs with one JSON argument (the API URL, the
token, the Chromium binary, the output folder for screenshots, the clusters the mesh
holds). It checks the page against what the API answers at the same moment, asks the
Rust side to stop an agent (prints `STOP <cluster>`, waits for a line on stdin) and
watches the row turn `down` without a reload. Any failure raises; the exit status says
whether every check passed. Progress goes to stderr.
"""

import re
import sys

from playwright.sync_api import sync_playwright

from pagecheck import API, SPEC, TOKEN, WAIT_MS, ZONE, api, check, log, open_page, run, shot


def rows(page):
    return page.eval_on_selector_all(
        "[data-testid=cluster-row]",
        "els => els.map(e => ({cluster: e.dataset.cluster, zone: e.dataset.zone, status: e.dataset.status}))",
    )


CONTRAST_JS = """
sel => {
  const parse = c => c.match(/[\\d.]+/g).slice(0, 3).map(Number);
  const lum = rgb => { const [r, g, b] = rgb.map(v => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; });
    return 0.2126 * r + 0.7152 * g + 0.0722 * b; };
  return [...document.querySelectorAll(sel)].map(el => {
    const s = getComputedStyle(el);
    let bg = s.backgroundColor, p = el;
    while (/rgba\\(.*, 0\\)$/.test(bg) || bg === 'transparent') { p = p.parentElement; if (!p) { bg = 'rgb(255, 255, 255)'; break; } bg = getComputedStyle(p).backgroundColor; }
    const a = lum(parse(s.color)), b = lum(parse(bg));
    return {text: el.textContent.trim(), cls: el.className, ratio: (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05)};
  });
}
"""

UNLABELLED_JS = """
() => {
  const named = el => (el.labels && el.labels.length && [...el.labels].some(l => l.textContent.trim()))
    || el.getAttribute('aria-label') || el.getAttribute('aria-labelledby');
  const bad = [];
  for (const el of document.querySelectorAll('input, select, textarea')) if (!named(el)) bad.push(el.outerHTML.slice(0, 80));
  for (const el of document.querySelectorAll('button, a[href]')) if (!(el.textContent.trim() || el.getAttribute('aria-label'))) bad.push(el.outerHTML.slice(0, 80));
  for (const el of document.querySelectorAll('img')) if (!el.hasAttribute('alt')) bad.push(el.outerHTML.slice(0, 80));
  return bad;
}
"""


def main():
    problems = []  # console errors, page errors, failed asset loads
    allowed_401 = [False]

    def expected_401(text):
        if allowed_401[0] and "401" in text:
            log("expected:", text)
            return True
        return False

    with sync_playwright() as pw:
        browser, page = open_page(pw, problems, expected_401)

        # ---- first load: GET / lands on /ui/; without the read token live data is hidden.
        page.goto(API + "/")
        check(page.url == API + "/ui/", f"GET / redirects to /ui/ (at {page.url})")
        page.wait_for_selector("[data-testid=cluster-row]", timeout=WAIT_MS)
        page.wait_for_selector("#notice:not([hidden])", timeout=WAIT_MS)
        check("read token" in page.inner_text("#notice"), "without a token the page says live data needs the read token")
        check(page.evaluate("() => !!document.querySelector('link[rel=icon]')"), "the page names its icon")

        # ---- the token, through the dialog.
        page.click("#token-button")
        page.wait_for_selector("#token-dialog[open]")
        page.fill("#token-input", TOKEN)
        shot(page, "token-dialog.png")
        page.click("#token-form button[value=save]")
        page.wait_for_selector("#notice", state="hidden", timeout=WAIT_MS)
        check(page.evaluate("() => sessionStorage.getItem('meshcat-token')") == TOKEN, "the token is kept in sessionStorage")

        # ---- summary and statuses: what the API shows.
        clusters = api("/clusters")
        want = {(c["zoneName"], c["clusterName"]): c["status"] for c in clusters}
        meta = api("/summary")["metadata"]
        expect = {
            "clusters": meta["clusterCount"], "stable": meta["clusterStableCount"],
            "warning": meta["clusterWarningCount"], "down": meta["clusterDownCount"],
            "instances": meta["instanceCount"],
        }
        page.wait_for_function(
            "e => { const s = document.querySelector('[data-testid=summary]').dataset;"
            " return Object.entries(e).every(([k, v]) => Number(s[k]) === v); }",
            arg=expect, timeout=WAIT_MS,
        )
        log("ok: summary hooks equal GET /summary metadata", expect)
        seen = rows(page)
        check(0 < len(seen) < len(clusters), f"only visible rows are rendered ({len(seen)} of {len(clusters)})")
        for r in seen:
            check(want[(r["zone"], r["cluster"])] == r["status"], f"row {r['zone']}/{r['cluster']} shows {r['status']} as the API")
        for name, status in SPEC["statuses"].items():
            check(want[(ZONE, name)] == status, f"API has {name} {status}")
            check(any(r["cluster"] == name and r["status"] == status for r in seen), f"table shows {name} {status}")
        shot(page, "overview.png")

        # ---- search by name, owner and capability.
        for term in SPEC["searches"]:
            page.fill("[data-testid=search]", term)
            t = term.lower()
            expected = sorted(
                c["clusterName"] for c in clusters
                if any(t in (c.get(k) or "").lower() for k in ("clusterName", "name", "owner", "capability"))
            )
            page.wait_for_function(
                "n => document.querySelectorAll('[data-testid=cluster-row]').length === n",
                arg=len(expected), timeout=WAIT_MS,
            )
            got = sorted(r["cluster"] for r in rows(page))
            check(got == expected, f"search {term!r} shows {got}")
        page.fill("[data-testid=search]", "")
        page.wait_for_function("n => document.querySelectorAll('[data-testid=cluster-row]').length === n",
                               arg=len(seen), timeout=WAIT_MS)

        # ---- keyboard: Tab reaches the table, arrows move, End/Home jump, Enter opens.
        page.focus("#zone-filter")
        page.keyboard.press("Tab")
        focused = lambda: page.evaluate("() => document.activeElement.dataset.cluster || null")
        first = focused()
        check(first == seen[0]["cluster"], f"Tab from the filters focuses the first row ({first})")
        page.keyboard.press("ArrowDown")
        check(focused() == seen[1]["cluster"], "ArrowDown focuses the next row")
        page.keyboard.press("End")
        last = page.evaluate("() => document.activeElement.dataset.index")
        check(last == str(len(clusters) - 1) and focused() == sorted(clusters, key=lambda c: (c["zoneName"], c["clusterName"]))[-1]["clusterName"],
              "End focuses the last cluster (a row rendered on demand)")
        page.keyboard.press("Home")
        check(focused() == first, "Home focuses the first row again")
        page.keyboard.press("ArrowDown")
        page.keyboard.press("ArrowDown")
        target = focused()
        page.keyboard.press("Enter")
        page.wait_for_selector(f"[data-testid=cluster-view][data-cluster='{target}']", timeout=WAIT_MS)
        check(True, f"Enter opens the cluster view of the focused row ({target})")
        page.click("a.back")
        page.wait_for_selector("[data-testid=cluster-row]", timeout=WAIT_MS)

        # ---- the cluster view of the busy cluster, with an instance's real request count.
        busy, inst = SPEC["busy"], SPEC["busyInstance"]
        page.fill("[data-testid=search]", busy)
        page.click(f"[data-testid=cluster-row][data-cluster='{busy}']")
        view = f"[data-testid=cluster-view][data-cluster='{busy}'][data-zone='{ZONE}']"
        page.wait_for_selector(view, timeout=WAIT_MS)
        check(page.get_attribute(view, "data-status") == want[(ZONE, busy)], "the cluster view shows the API's status")
        record = api(f"/clusters/{busy}?zoneName={ZONE}")[0]
        names = sorted(i["name"] for i in record["instances"])
        page.wait_for_function(
            "n => document.querySelectorAll('[data-testid=instance-row]').length === n",
            arg=len(names), timeout=WAIT_MS,
        )
        got = sorted(page.eval_on_selector_all("[data-testid=instance-row]", "els => els.map(e => e.dataset.instance)"))
        check(got == names, f"instance rows are the API's instances {names}")
        metrics = api(f"/metrics/{busy}/{inst}?zoneName={ZONE}")
        requests = metrics["Total/requests"]
        check(requests == SPEC["busyRequests"], f"the API reports {requests} requests for {inst}")
        sel = f"[data-testid=instance-metrics][data-instance='{inst}'][data-requests='{requests}']"
        page.wait_for_selector(sel, timeout=WAIT_MS)
        check(True, f"the cluster view shows {inst} with data-requests={requests}")
        # Two readings make a rate: the chart draws a line.
        page.wait_for_selector(f"[data-testid=instance-metrics][data-instance='{inst}'] svg.chart polyline", state="attached", timeout=WAIT_MS)
        check(str(requests) in page.inner_text(f"[data-testid=instance-metrics][data-instance='{inst}']"), "the request count is shown as text")
        check(page.inner_text(f"[data-testid=instance-row][data-instance='{inst}'] .inst-head").count("age") == 1, "instances show their age")
        shot(page, "cluster.png", full=True)

        # ---- the cluster's recent changes and its drift, as the API has them.
        hist = api(f"/clusters/{busy}/history?zoneName={ZONE}&limit=50")
        ids = [str(e["id"]) for e in hist]
        page.wait_for_function(
            "ids => { const got = [...document.querySelectorAll('[data-testid=history] [data-testid=history-entry]')]"
            ".map(e => e.dataset.id); return got.length === ids.length && got.every((v, i) => v === ids[i]); }",
            arg=ids, timeout=WAIT_MS,
        )
        check(bool(ids), f"the timeline shows the API's {len(ids)} entries, newest first")
        kinds = page.eval_on_selector_all("[data-testid=history-entry]", "els => els.map(e => e.dataset.kind)")
        check(kinds == [e["kind"] for e in hist], f"the timeline's kinds are the API's {kinds}")
        marked = page.eval_on_selector_all(
            "[data-testid=history-entry][data-status-change=true]", "els => els.map(e => [e.dataset.from, e.dataset.to])")
        want_marked = [[e["detail"]["from"], e["detail"]["to"]] for e in hist if e["kind"] == "status-changed"]
        check(marked and marked == want_marked, f"status changes are marked with where they went {marked}")
        drift = api(f"/clusters/{busy}/drift?zoneName={ZONE}")
        check(not drift["drifted"], "the API says the busy cluster runs one configuration")
        page.wait_for_selector(
            f"[data-testid=drift][data-drifted=false][data-groups='{len(drift['groups'])}']", timeout=WAIT_MS)
        check(page.locator("[data-testid=drift-group]").count() == 0, "no drift groups are listed without drift")
        # A registration edit reaches the timeline without a reload.
        page.evaluate("() => { window.__sameDocument = true; }")
        api(f"/clusters/{busy}?zoneName={ZONE}", "PUT", body=SPEC["busyEdit"])
        page.wait_for_selector("[data-testid=history] [data-testid=history-entry]:first-child[data-kind=cluster-updated]",
                               timeout=WAIT_MS)
        check(page.evaluate("() => window.__sameDocument === true"), "the edit shows at the top of the timeline live")
        check("version" in page.inner_text("[data-testid=history-entry][data-kind=cluster-updated]"),
              "the edit names the field it changed")

        # ---- a drifted cluster: its badge and its groups, as the API has them.
        drifted = SPEC["drifted"]
        page.evaluate(f"() => {{ location.hash = '#/c/{ZONE}/{drifted}'; }}")
        drift = api(f"/clusters/{drifted}/drift?zoneName={ZONE}")
        check(drift["drifted"], f"the API says {drifted} is drifted")
        page.wait_for_selector(
            f"[data-testid=cluster-view][data-cluster='{drifted}'] [data-testid=drift][data-drifted=true][data-groups='{len(drift['groups'])}']",
            timeout=WAIT_MS)
        groups = page.eval_on_selector_all(
            "[data-testid=drift-group]", "els => els.map(e => [e.dataset.configHash, e.dataset.instances])")
        want_groups = [[g["configHash"], ",".join(g["instances"])] for g in drift["groups"]]
        check(sorted(groups) == sorted(want_groups), f"the drift groups are the API's {groups}")
        page.wait_for_selector("[data-testid=history-entry][data-kind=drift-started]", timeout=WAIT_MS)
        check(True, "the timeline holds the drift's start")
        shot(page, "cluster-drift.png", full=True)
        page.evaluate(f"() => {{ location.hash = '#/c/{ZONE}/{busy}'; }}")
        page.wait_for_selector(f"[data-testid=instance-metrics][data-instance='{inst}'][data-requests]", timeout=WAIT_MS)

        # ---- the diagnosis, as the API runs it.
        page.click("[data-testid=diagnose-button]")
        page.wait_for_selector("[data-testid=diagnose-conclusion]", timeout=60_000)
        report = api(f"/diagnose/{busy}?zoneName={ZONE}")
        steps = page.eval_on_selector_all("[data-testid=diagnose-step]", "els => els.map(e => [e.dataset.step, e.dataset.verdict])")
        check([s[0] for s in steps] == [s["name"] for s in report["steps"]], f"diagnosis steps in the API's order: {[s[0] for s in steps]}")
        check(all(v in ("pass", "fail", "skipped") for _, v in steps), "every step has a verdict")
        shown = page.inner_text("[data-testid=diagnose-conclusion]")
        check(report["conclusion"] and report["conclusion"] in shown, f"the API's conclusion is rendered ({shown})")
        changes = page.eval_on_selector_all("[data-testid=diagnose-change]", "els => els.map(e => Number(e.dataset.id))")
        recorded = {e["id"] for e in api(f"/clusters/{busy}/history?zoneName={ZONE}&limit=1000")}
        check(changes and set(changes) <= recorded and changes == sorted(changes, reverse=True),
              f"the diagnosis lists the cluster's recent changes, newest first ({len(changes)})")
        page.locator("[data-testid=diagnose-conclusion]").scroll_into_view_if_needed()
        shot(page, "diagnosis.png", full=True)

        # ---- accessibility basics on the cluster view and its controls.
        bad = page.evaluate(UNLABELLED_JS)
        check(not bad, f"every control of the cluster view has a label or name {bad}")

        # ---- the log level needs the write token: without it the page asks, then sets it.
        page.click("#token-button")
        page.click("#token-form button[value=clear]")
        page.wait_for_function("() => !sessionStorage.getItem('meshcat-token')")
        page.select_option("#cluster-level", "warn")
        allowed_401[0] = True
        page.click("text=Set on every instance")
        page.wait_for_selector("#token-dialog[open]", timeout=WAIT_MS)
        check("write token" in page.inner_text("#token-reason"), "a 401 opens the token dialog saying why")
        page.fill("#token-input", TOKEN)
        page.click("#token-form button[value=save]")
        page.wait_for_function(
            "() => /instance\\(s\\) set/.test(document.querySelector('#cluster-level').closest('.level').textContent)",
            timeout=WAIT_MS,
        )
        allowed_401[0] = False
        for n in names:
            level = api(f"/zones/{ZONE}/clusters/{busy}/instances/{n}/logging").strip()
            check(level in ("warn", "warning"), f"sidecar {n} is at warn after the retry with the token ({level})")

        # ---- live: stopping an agent turns its row down without a reload.
        page.click("a.back")
        page.fill("[data-testid=search]", "")
        page.wait_for_selector("[data-testid=cluster-row]", timeout=WAIT_MS)
        page.evaluate("() => { window.__sameDocument = true; }")
        victim = SPEC["stop"]
        # The page follows GET /events (contract section 12), it does not poll.
        page.wait_for_selector("[data-testid=live-status][data-state=live]", timeout=WAIT_MS)
        mode = page.get_attribute("[data-testid=live-status]", "data-state")
        check(mode == "live", f"live-status is {mode}")
        before_down = int(page.get_attribute("[data-testid=summary]", "data-down"))
        print(f"STOP {victim}", flush=True)
        line = sys.stdin.readline().strip()
        check(line == "stopped", f"the agent of {victim} stopped ({line!r})")
        page.wait_for_selector(f"[data-testid=cluster-row][data-cluster='{victim}'][data-status=down]", timeout=WAIT_MS)
        check(page.evaluate("() => window.__sameDocument === true"), f"{victim} turned down without a reload")
        check(api(f"/clusters/{victim}?zoneName={ZONE}")[0]["status"] == "down", "the API says down too")
        page.wait_for_function(
            "n => Number(document.querySelector('[data-testid=summary]').dataset.down) === n",
            arg=before_down + 1, timeout=WAIT_MS,
        )
        check(True, "the summary counts one more down cluster")

        # ---- registrations show and leave without a reload too.
        api("/clusters", "POST", body={"zoneName": ZONE, "clusterName": "newcomer", "name": "Newcomer", "owner": "team-new"})
        page.wait_for_selector("[data-testid=cluster-row][data-cluster=newcomer][data-status=down]", timeout=WAIT_MS)
        check(True, "a cluster registered through the API appears")
        api(f"/clusters/newcomer?zoneName={ZONE}", "DELETE")
        page.wait_for_selector("[data-testid=cluster-row][data-cluster=newcomer]", state="detached", timeout=WAIT_MS)
        check(page.evaluate("() => window.__sameDocument === true"), "a deleted cluster leaves, still without a reload")

        # ---- contrast of the status words and of the text.
        ratios = page.evaluate(CONTRAST_JS, ".badge, .row.head span, .muted, body, .live")
        low = [r for r in ratios if r["ratio"] < 4.5]
        check(not low, f"text contrast is at least 4.5:1 everywhere checked ({len(ratios)} elements) {low[:3]}")
        statuses = {w for r in ratios if "badge" in r["cls"] for w in re.findall(r"[a-z]+", r["text"])}
        check({"stable", "warning", "down"} <= statuses, f"status badges carry the word ({statuses})")
        bad = page.evaluate(UNLABELLED_JS)
        check(not bad, f"every control of the overview has a label or name {bad}")
        shot(page, "overview-after-stop.png")

        # ---- phone width: no sideways scrolling, on the overview and the cluster view.
        page.set_viewport_size({"width": 390, "height": 844})
        page.wait_for_function("() => document.documentElement.scrollWidth <= 390")
        check(True, "no sideways scrolling at 390 px (overview)")
        shot(page, "phone-overview.png")
        page.click(f"[data-testid=cluster-row][data-cluster='{busy}']")
        page.wait_for_selector(f"[data-testid=instance-metrics][data-instance='{inst}'][data-requests]", timeout=WAIT_MS)
        page.wait_for_function("() => document.documentElement.scrollWidth <= 390")
        check(True, "no sideways scrolling at 390 px (cluster view)")
        shot(page, "phone-cluster.png", full=True)

        browser.close()

    check(not problems, f"no console errors and no failed asset loads {problems}")
    log("all checks passed")


if __name__ == "__main__":
    run(main)
