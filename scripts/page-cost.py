#!/usr/bin/env python3
"""What a durable one-row commit costs on this disk by the number of B-trees it touches: a
table keyed by (zone, name) with 300 bytes of content and 0 to 6 more indexes, in WAL mode with
synchronous=FULL (as the store runs), each insert its own transaction, after 5,000 rows.

    scripts/page-cost.py [COMMITS]

Two rows per tree count: SQLite's automatic checkpoint on (the log starts again every 1,000
frames, as in a running store), then off (the log file grows, so the pages a commit wrote are
counted from its size). Used to tell a send's pages from its CPU (docs/PERFORMANCE.md).
"""
import os
import sqlite3
import sys
import tempfile
import time


def run(folder: str, indexes: int, commits: int, checkpoint: bool) -> tuple[float, float]:
    path = os.path.join(folder, f"t{indexes}-{int(checkpoint)}.sqlite")
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    extra = "".join(f", c{i} TEXT" for i in range(indexes))
    db.execute(f"CREATE TABLE t (zone TEXT, name TEXT, content TEXT{extra}, PRIMARY KEY (zone, name))")
    for i in range(indexes):
        db.execute(f"CREATE INDEX i{i} ON t (zone, c{i})")
    insert = f"INSERT INTO t VALUES (?, ?, ?{', ?' * indexes})"
    content = "x" * 300
    db.execute("BEGIN")
    for j in range(5000):
        db.execute(insert, ["zone", f"w{j:08d}", content] + [f"{j:08d}{i}" * 3 for i in range(indexes)])
    db.execute("COMMIT")
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    if not checkpoint:
        db.execute("PRAGMA wal_autocheckpoint=0")
    start = time.perf_counter()
    for j in range(commits):
        db.execute("BEGIN IMMEDIATE")
        db.execute(insert, ["zone", f"m{j:08d}", content] + [f"m{j:08d}{i}" * 3 for i in range(indexes)])
        db.execute("COMMIT")
    rate = commits / (time.perf_counter() - start)
    frames = (os.path.getsize(path + "-wal") - 32) // (4096 + 24)
    db.close()
    return rate, frames / commits


def main() -> int:
    commits = int(sys.argv[1]) if len(sys.argv) > 1 else 1500
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR", "/tmp")) as folder:
        print("trees  commits/s (checkpointing)  commits/s (log growing)  pages a commit")
        for indexes in [0, 1, 2, 3, 4, 6]:
            steady, _ = run(folder, indexes, commits, checkpoint=True)
            growing, pages = run(folder, indexes, commits, checkpoint=False)
            print(f"{indexes + 2:5}  {steady:24.0f}  {growing:23.0f}  {pages:14.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
