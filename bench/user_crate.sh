#!/usr/bin/env bash
# The runtime's allocation benchmark, built as a user's crate builds it: in a
# folder outside this repository, so that none of its build settings (the
# forced frame pointers of .cargo/config.toml, its release profile) apply.
#
#   bash bench/user_crate.sh [CRITERION ARGS...]
#
# Compare with the same benchmark inside the workspace:
#   cargo bench -p snapdiff-runtime --bench alloc
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
dir=$(mktemp -d /tmp/snapdiff-user-crate.XXXXXX)
trap 'rm -rf "$dir"' EXIT
cp -r "$repo/tests/user-crate/." "$dir/"
cp "$repo/Cargo.lock" "$dir/"
sed -i "s|REPO|$repo|g" "$dir/Cargo.toml"
cd "$dir"
# The build is kept between runs; the folder's name keeps it apart from
# the workspace's own.
CARGO_TARGET_DIR="$repo/target/user-crate" cargo bench --bench alloc -- "$@"
