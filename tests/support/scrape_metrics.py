"""Scrapes a `snapdiff watch --metrics` endpoint as Prometheus would and
parses it with Prometheus's own Python client (its OpenMetrics parser,
which rejects text that breaks the format). Prints the samples as JSON:
[{"name", "labels", "value"}], and the response's content type.

    python3 scrape_metrics.py http://127.0.0.1:PORT/metrics
"""

import json
import sys
import urllib.request

from prometheus_client.openmetrics.parser import text_string_to_metric_families

request = urllib.request.Request(
    sys.argv[1], headers={"Accept": "application/openmetrics-text; version=1.0.0"}
)
with urllib.request.urlopen(request, timeout=30) as response:
    content_type = response.headers.get("Content-Type")
    text = response.read().decode("utf-8")
samples = [
    {"name": s.name, "labels": s.labels, "value": s.value}
    for family in text_string_to_metric_families(text)
    for s in family.samples
]
print(json.dumps({"content_type": content_type, "samples": samples}))
