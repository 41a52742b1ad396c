"""A Ray cluster of three nodes on this machine (`ray.cluster_utils.Cluster`),
run by test_fleet.py in a process of its own (a process joins one
cluster): the job's folders placed on the nodes, one node in three each,
judged with `snapdiff.fleet({node: paths}, engine="ray")`; then again
with the third node busy (a task holds its one CPU, so its work waits)
and removed while the fleet waits on it. Prints what the test checks, as
JSON.

    python3 ray_nodes.py JOB
"""

import json
import os
import sys
import threading
import time

import ray
from ray.cluster_utils import Cluster
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

import snapdiff


def snapshots_under(folder):
    return sum(
        1 for _, _, names in os.walk(folder) for n in names if n.endswith((".snap", ".pickle"))
    )


def occupy(seconds):
    """Holds a CPU of the node it runs on."""
    time.sleep(seconds)


def main():
    job = sys.argv[1]
    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False}
    )
    nodes = [cluster.head_node, cluster.add_node(num_cpus=1), cluster.add_node(num_cpus=1)]
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    ids = [n.node_id for n in nodes]
    folders = sorted(os.path.join(job, f) for f in os.listdir(job))
    placed = {ids[i]: folders[i::3] for i in range(3)}
    result = snapdiff.fleet(placed, engine="ray")
    report = {
        "nodes": len({n["NodeID"] for n in ray.nodes() if n["Alive"]}),
        "placed": {node: sum(map(snapshots_under, paths)) for node, paths in placed.items()},
        "read_on": result.read_on,
        "processes": result.processes,
        "files": result.files,
        "leaks": [[leak.ranks, leak.culprit.file, leak.culprit.line] for leak in result.leaks],
        "failed": result.failed,
    }

    # The third node's one CPU is held, so what the fleet asks of it waits;
    # the node is removed meanwhile, and what it held is named as failed.
    lost = nodes[2]
    on_lost = NodeAffinitySchedulingStrategy(ids[2], soft=False)
    hold = ray.remote(num_cpus=1)(occupy).options(scheduling_strategy=on_lost)
    held = hold.remote(600)
    ray.wait([held], timeout=2)
    timer = threading.Timer(3.0, cluster.remove_node, args=(lost,))
    timer.start()
    started = time.monotonic()
    removed = snapdiff.fleet(placed, engine="ray")
    timer.join()
    report["after_removal"] = {
        "seconds": round(time.monotonic() - started, 1),
        "processes": removed.processes,
        "files": removed.files,
        "failed": removed.failed,
        "read_on": removed.read_on,
        "lost": ids[2],
    }
    print(json.dumps(report))
    ray.shutdown()
    cluster.shutdown()


if __name__ == "__main__":
    main()
