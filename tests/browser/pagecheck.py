"""What the browser scripts of tests/browser/ share: the JSON argument the Rust test
passes, logging, checks, screenshots, calls to the API, and a page in Debian's
Chromium (through Playwright) that records every console error, page error, failed
request and failing load of the dashboard's own files.
"""

import json
import os
import sys
import urllib.request

SPEC = json.loads(sys.argv[1])
API = SPEC["api"]
TOKEN = SPEC["token"]
OUT = SPEC["out"]
ZONE = SPEC["zone"]
WAIT_MS = 20_000
NAME = os.path.basename(sys.argv[0])


def log(*a):
    print(f"{NAME}:", *a, file=sys.stderr, flush=True)


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    log("ok:", what)


def run(main):
    """Runs a script's `main`; a failure ends the script with status 1 and its reason
    on stderr, one line, where the Rust test reads it."""
    try:
        main()
    except Exception as e:  # noqa: BLE001 - any failure is the script's answer
        log("FAILED:", type(e).__name__, e)
        sys.exit(1)


def shot(page, name, full=False):
    path = os.path.join(OUT, name)
    page.screenshot(path=path, full_page=full)
    log("screenshot", path)


def api(path, method="GET", token=True, body=None):
    """Calls the API (with the token unless `token` is false); answers its JSON, or its
    text when it is not JSON."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(API + path, method=method, data=data)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("Authorization", "Bearer " + TOKEN)
    with urllib.request.urlopen(req, timeout=30) as r:
        body = r.read()
        ctype = r.headers.get("Content-Type", "")
        return json.loads(body) if "json" in ctype else body.decode()


def open_page(pw, problems, console_error=None):
    """A 1280x800 page in the Chromium of the spec. Every console error (unless
    `console_error(message)` answers true: expected), page error, failed request
    (the event stream's, cut when the page leaves, excepted) and 4xx/5xx load of the
    dashboard's files or icon goes into `problems`. Answers (browser, page)."""
    os.makedirs(OUT, exist_ok=True)
    browser = pw.chromium.launch(
        executable_path=SPEC["chromium"],
        headless=True,
        args=["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"],
    )
    page = browser.new_context(viewport={"width": 1280, "height": 800}).new_page()

    def on_console(m):
        if m.type != "error" or (console_error and console_error(m.text)):
            return
        problems.append(f"console error: {m.text} at {m.location}")

    page.on("console", on_console)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on(
        "requestfailed",
        lambda r: problems.append(f"request failed: {r.url}") if "/events" not in r.url else None,
    )
    page.on(
        "response",
        lambda r: problems.append(f"{r.status} for {r.url}")
        if r.status >= 400 and ("/ui/" in r.url or "favicon" in r.url)
        else None,
    )
    return browser, page
