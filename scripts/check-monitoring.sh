#!/usr/bin/env bash
# Checks deploy/kubernetes/monitoring with promtool (Debian's prometheus package):
#   - the generated copies (the dashboard's ConfigMap, the PrometheusRule) are what
#     generate.sh makes of dashboard.json and alerts.yml;
#   - `promtool check rules` on alerts.yml and `promtool test rules` on its unit tests
#     (alerts_test.yml);
#   - every query of the Grafana dashboard (each panel's expressions and each
#     variable's label_values() selector, with Grafana's variables put in) parses as
#     PromQL: they become the recording rules of a temporary rules file that
#     `promtool check rules` reads. A self-test first feeds it a broken query and
#     fails if that is not caught;
#   - every variable in a regex matcher of the dashboard is written `${var:regex}`
#     inside backticks (Grafana escapes the value's regex metacharacters with single
#     backslashes, which a PromQL raw string keeps), with a self-test on a copy that
#     uses `"$owner"`;
#   - the Alertmanager routing example (deploy/monitoring/alertmanager.yml) with
#     `amtool check-config`, and `amtool config routes test` sends alerts of each
#     owner to the receiver the example means.
# That the rules and the dashboard name only series the aggregator exposes is checked
# against a real aggregator by tests/tests/e2e_alerts.rs. Exits non-zero on any
# problem.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir="$root/deploy/kubernetes/monitoring"

for tool in promtool:prometheus amtool:prometheus-alertmanager; do
    if ! command -v "${tool%%:*}" >/dev/null 2>&1; then
        echo "check-monitoring: ${tool%%:*} missing: apt-get install ${tool#*:} (scripts/test.sh does it)" >&2
        exit 1
    fi
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

echo "--> generated copies"
"$dir/generate.sh" --check

echo "--> promtool check rules, promtool test rules"
promtool check rules "$dir/alerts.yml"
(cd "$dir" && promtool test rules alerts_test.yml)

# dashboard_rules DASHBOARD OUT: writes the dashboard's queries as a rules file.
dashboard_rules() {
    python3 - "$1" "$2" <<'PY'
import json, re, sys

dashboard = json.load(open(sys.argv[1]))
queries = []

def panels(ps):
    for p in ps:
        for t in p.get("targets", []):
            if t.get("expr"):
                queries.append((f"dashboard_panel_{p['id']}_{t['refId']}", t["expr"]))
        panels(p.get("panels", []))

panels(dashboard.get("panels", []))
for v in dashboard.get("templating", {}).get("list", []):
    if v.get("type") != "query":
        continue
    q = v.get("query")
    q = q.get("query", "") if isinstance(q, dict) else q
    m = re.fullmatch(r"\s*label_values\((.*),\s*\w+\s*\)\s*", q, re.S)
    queries.append((f"dashboard_variable_{v['name']}", m.group(1) if m else q))
if not queries:
    sys.exit("the dashboard has no queries")

def grafana_variables(expr):
    expr = re.sub(r"\$__(rate_interval|interval|range)\b", "5m", expr)
    return re.sub(r"\$\{\w+(:\w+)?\}|\$\w+", ".*", expr)

rules = [{"record": name, "expr": grafana_variables(e)} for name, e in queries]
# JSON is YAML: promtool reads it as a rules file.
json.dump({"groups": [{"name": "dashboard", "rules": rules}]}, open(sys.argv[2], "w"), indent=1)
print(f"{len(rules)} dashboard queries")
PY
}

echo "--> dashboard queries"
python3 - "$dir/dashboard.json" "$tmp/broken.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
first = next(p for p in d["panels"] if p.get("targets"))
first["targets"][0]["expr"] += " by ("
json.dump(d, open(sys.argv[2], "w"))
PY
dashboard_rules "$tmp/broken.json" "$tmp/broken-rules.json" >/dev/null
if promtool check rules "$tmp/broken-rules.json" >/dev/null 2>&1; then
    echo "check-monitoring: FAILED: self-test: a broken dashboard query was not caught" >&2
    exit 1
fi
dashboard_rules "$dir/dashboard.json" "$tmp/dashboard-rules.json"
promtool check rules "$tmp/dashboard-rules.json"

echo "--> dashboard variables in regex matchers"
# regex_variables DASHBOARD: fails naming each variable of a query that is not
# ${var:regex} in backticks right after =~ or !~.
regex_variables() {
    python3 - "$1" <<'PY'
import json, re, sys

text = json.dumps(json.load(open(sys.argv[1])))
bad = []
for m in re.finditer(r"\$\{?(\w+)(:\w+)?\}?", text):
    name = m.group(1)
    if name.startswith("__") or name == "datasource":
        continue
    if not (text[max(0, m.start() - 3):m.start()] in ("=~`", "!~`")
            and m.group(0) == "${" + name + ":regex}"
            and text[m.end():m.end() + 1] == "`"):
        bad.append(text[max(0, m.start() - 12):m.end() + 3])
if bad:
    sys.exit("variables not written =~`${var:regex}`: " + "; ".join(bad))
PY
}
sed 's/owner=~`${owner:regex}`/owner=~\\"$owner\\"/' "$dir/dashboard.json" >"$tmp/unescaped.json"
if cmp -s "$dir/dashboard.json" "$tmp/unescaped.json" || regex_variables "$tmp/unescaped.json" 2>/dev/null; then
    echo "check-monitoring: FAILED: self-test: a variable without the regex format was not caught" >&2
    exit 1
fi
regex_variables "$dir/dashboard.json"

echo "--> Alertmanager routing example"
routing="$root/deploy/monitoring/alertmanager.yml"
amtool check-config "$routing"
# receiver, then the labels of an alert that must reach it.
while read -r receiver labels; do
    # shellcheck disable=SC2086 # the labels are separate arguments
    if ! got=$(amtool config routes test --config.file="$routing" --verify.receivers="$receiver" $labels 2>/dev/null); then
        echo "check-monitoring: FAILED: an alert with $labels goes to $got, not $receiver" >&2
        exit 1
    fi
    echo "$labels -> $got"
done <<'ROUTES'
team-payments-pager alertname=MeshcatClusterDown severity=critical owner=team-payments
team-payments alertname=MeshcatClusterWarning severity=warning owner=team-payments
owner-channel alertname=MeshcatEdgeErrorRatioHigh severity=warning owner=team-orders owner_of=source
platform alertname=MeshcatReplicaNotReady severity=critical owner=platform
platform alertname=MeshcatEdgeErrorRatioHigh severity=warning
team-payments-pager alertname=MeshcatCertificateExpired severity=critical owner=team-payments
owner-channel alertname=MeshcatCertificateExpiringSoon severity=warning owner=team-orders
platform alertname=MeshcatCertificateRotationOverdue severity=critical owner=platform
owner-channel alertname=MeshcatTlsSanMismatch severity=warning owner=team-edge
ROUTES

echo "check-monitoring: OK: rules checked and unit-tested, dashboard queries valid, generated copies current, routing example valid"
