#!/usr/bin/env bash
# The tests, as README.md gives them: every test of the workspace, then one
# line for each missing dependency whose tests could not check anything
# here (a passing test's own output is hidden by cargo's harness), and the
# counts. Every test binary runs, whichever fails first (--no-fail-fast):
# a failure never hides the tests after it. Arguments go to `cargo test`.
set -uo pipefail
cd "$(dirname "$0")/.."

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export SNAPDIFF_SKIPS="$work/skips.tsv"

cargo test --workspace --no-fail-fast "$@" 2>&1 | tee "$work/log"
status=${PIPESTATUS[0]}

# Tests that skipped for want of a dependency passed as far as cargo knows.
skipped=0
if [[ -s "$SNAPDIFF_SKIPS" ]]; then
    echo
    while IFS=$'\t' read -r count dependency install; do
        echo "not run: $count test(s) need $dependency ($install)"
        skipped=$((skipped + count))
    done < <(sort -u "$SNAPDIFF_SKIPS" | awk -F'\t' '{n[$1]++; how[$1]=$2} END {for (d in n) print n[d] "\t" d "\t" how[d]}' | sort -k2)
fi
read -r passed failed < <(awk '/^test result:/ {p += $4; f += $6} END {print p + 0, f + 0}' "$work/log")
echo "tests: $((passed - skipped)) passed, $failed failed, $skipped skipped"
exit "$status"
