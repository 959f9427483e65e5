#!/usr/bin/env bash
# The long run of the differential tests of meshcat's hand-written readers of
# untrusted input (docs/reliability.md, "Parsers"): at least 1,000,000 cases per
# reader, instead of the few hundred per property of the normal test command, with
# the workspace's crates built optimised (opt-level 2; the dependencies as the tests
# build them). A reader tested by several properties has its million split between
# them (the table below); any other differential test gets PROPTEST_CASES (default
# 1,000,000). One property after another; each one's cases and time are printed,
# the run's total at the end.
#
#   scripts/parsers-long.sh
#   SCALE=10 scripts/parsers-long.sh              # a tenth of the cases
#   PROPTEST_RNG_SEED=7 scripts/parsers-long.sh   # another seed than the fixed one
#   scripts/parsers-long.sh meshcat-cli           # one crate's
#
# A failure prints its shrunk input and adds its seed to the crate's
# proptest-regressions/ file: keep it there once the reader is fixed.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
export CARGO_PROFILE_DEV_DEBUG="${CARGO_PROFILE_DEV_DEBUG:-false}"
export CARGO_PROFILE_DEV_OPT_LEVEL="${CARGO_PROFILE_DEV_OPT_LEVEL:-2}"
default_cases="${PROPTEST_CASES:-1000000}"
scale="${SCALE:-1}"
start=$SECONDS

# Cases per property where a reader has several (the test name's last part).
declare -A cases=(
  # /clusters: 1,000,000 in all.
  [valid_answers_read_as_the_reference_reads_them]=300000
  [a_fault_where_it_reads_is_an_error]=200000
  [a_fault_where_it_passes_over_changes_no_answer]=200000
  [a_cut_answer_is_an_error]=100000
  [any_change_never_panics]=200000
  # /config_dump (and /clusters' any_change above shares the name).
  [valid_dumps_read_as_the_reference_reads_them]=800000
  # Log times.
  [valid_times_read_as_the_reference_reads_them]=250000
  [changed_times_read_as_the_reference_reads_them]=250000
  [any_text_never_panics]=250000
  [a_line_tells_its_time]=250000
  # /stats.
  [stats_read_as_the_reference_reads_them]=500000
  [changed_stats_never_panic]=500000
  # Rejection records.
  [rejection_records_read_back_as_written]=500000
  [any_log_lines_never_panic]=500000
  # Access lines.
  [lines_read_back_as_written]=500000
  [any_line_never_panics]=500000
  # The event stream's properties: the standard's reading, then any bytes.
  [any_bytes_never_panic]=200000
  # Plain tests among them: run once.
  [deep_nesting_is_passed_over]=1
  [deep_values_are_valid]=1
  [other_lines_are_no_entry]=1
  [a_duration_past_the_type_is_an_error]=1
  # The harness's own checks.
  [every_style_writes_the_same_valid_json]=20000
  [chunks_put_back_together_are_the_input]=20000
)

# The crates whose readers have differential tests (in `<reader>/differential.rs`
# or `differential.rs` modules, so their test names hold "differential"), each with
# its folder: a test binary runs from its crate's folder, as cargo runs it.
declare -A folder=(
  [meshcat-common]=common
  [meshcat-agent]=agent
  [meshcat-diagnose]=diagnose
  [meshcat-cli]=cli
  [meshcat-aggregator]=aggregator
)
crates=("$@")
if [ ${#crates[@]} -eq 0 ]; then
  crates=(meshcat-common meshcat-agent meshcat-diagnose meshcat-cli meshcat-aggregator)
fi
total=0
for crate in "${crates[@]}"; do
  echo "==> $crate"
  # Built once; the binary is then run directly, so the run holds no lock on the
  # target folder for the hours it takes.
  bin=$(cargo test --locked -q -p "$crate" --lib --no-run --message-format=json \
    | sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -1)
  cd "$root/${folder[$crate]}"
  mapfile -t tests < <("$bin" --list 2>/dev/null | sed -n 's/^\(.*differential.*\): test$/\1/p')
  for t in "${tests[@]}"; do
    n=$(( ${cases[${t##*::}]:-$default_cases} / scale ))
    s=$SECONDS
    if ! out=$(PROPTEST_CASES=$n "$bin" "$t" --exact --test-threads 1 2>&1); then
      echo "$out"
      echo "$crate $t: FAILED after $((SECONDS - s)) s"
      exit 1
    fi
    total=$((total + n))
    echo "$crate $t: $n cases, $((SECONDS - s)) s"
  done
  cd "$root"
done
echo "long run: $total cases in $((SECONDS - start)) s; $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
