"""Writes a fleet's site tables widened to COPIES times its ranks: copy k of
rank r is rank r + k * RANKS, its rows written in process order as
`snapdiff export` writes them (row groups of 131,072 rows, zstd). For
measuring `fleet` on tables of more ranks than are worth writing as
snapshots (100,000 ranks are a million files).

    python3 bench/widen_tables.py target/fleet/10000/tables 10 target/fleet/100000/tables
"""

import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

ROWS_PER_GROUP = 1 << 17


def widened(table: pa.Table, copy: int, ranks: int) -> pa.Table:
    rank = pc.add(table.column("rank"), pa.scalar(copy * ranks, pa.uint32()))
    process = pc.binary_join_element_wise("rank", pc.cast(rank, pa.string()), "")
    table = table.set_column(table.schema.get_field_index("rank"), "rank", rank)
    at = table.schema.get_field_index("process")
    return table.set_column(at, table.schema.field(at), process)


def main() -> None:
    source, copies, out = Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
    out.mkdir(parents=True, exist_ok=True)
    ranks = len(pc.unique(pq.read_table(source / "checkpoints.parquet").column("rank")))
    for name in ("checkpoints", "sites", "owners", "stacks"):
        table = pq.read_table(source / f"{name}.parquet")
        with pq.ParquetWriter(out / f"{name}.parquet", table.schema, compression="zstd") as writer:
            for copy in range(copies if name != "stacks" else 1):
                part = widened(table, copy, ranks) if name != "stacks" else table
                writer.write_table(part, row_group_size=ROWS_PER_GROUP)
    print(f"{ranks * copies} ranks written to {out}")


if __name__ == "__main__":
    main()
