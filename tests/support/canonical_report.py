#!/usr/bin/env python3
"""Print a `snapdiff compare --json` or `summary --json` report as sorted
text lines that say everything the report found, in either JSON schema:
1 (each site's frames inline) or 2 (frames and stacks in tables).

    python3 tests/support/canonical_report.py REPORT.json

The test `real_shaped_results_are_unchanged` compares these lines for a
generated real-shaped pair with those of the build before schema 2 and the
per-frame caches (tests/data/real-shaped-*.txt), so that a change meant to
make snapdiff faster cannot change what it finds.
"""

import hashlib
import json
import sys


def frames_of(site, report):
    if "frames" in site and isinstance(site["frames"], list):
        return site["frames"]
    return [report["frames"][i] for i in report["stacks"][site["stack"]]]


def site_line(site, report, fields):
    frames = frames_of(site, report)
    digest = hashlib.sha1(json.dumps([[f["name"], f["file"], f["line"]] for f in frames]).encode()).hexdigest()[:12]
    c = site["culprit"]
    values = " ".join(f"{k}={site[k]}" for k in fields)
    return f"site {site['key']} {values} culprit={c['kind']}:{c['name']}:{c['file']}:{c['line']} frames={len(frames)}:{digest}"


def main():
    with open(sys.argv[1]) as f:
        report = json.load(f)
    lines = []
    if "groups" in report:
        for k in ("leaked_bytes", "reserved_before", "reserved_after", "allocated_before", "allocated_after", "matching", "notes"):
            lines.append(f"{k} {json.dumps(report[k])}")
        fields = ("change", "blocks_before", "blocks_after", "bytes_before", "bytes_after", "delta_bytes", "allocated_before", "allocated_after", "blocks_kept")
        lines += sorted(site_line(g, report, fields) for g in report["groups"])
    else:
        for k in ("reserved_bytes", "allocated_bytes", "active_bytes", "requested_bytes", "trace_events", "actions", "pools", "fragmentation"):
            lines.append(f"{k} {json.dumps(report.get(k))}")
        lines += sorted(site_line(s, report, ("blocks", "bytes", "share")) for s in report["top_sites"])
    print("\n".join(lines))


if __name__ == "__main__":
    main()
