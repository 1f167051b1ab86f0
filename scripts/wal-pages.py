#!/usr/bin/env python3
"""Which tables and indexes a store's recent commits wrote: reads the frames of a SQLite
write-ahead log (each frame names the page it holds; a frame with a commit size ends a
transaction), maps each page to its table or index with SQLite's `dbstat`, and prints the
pages a commit wrote to each, averaged over the last N commits.

    scripts/wal-pages.py STORE.sqlite [N]

Copy the store and its -wal file first if anything still writes to it (the log is read as it
is; nothing is checkpointed). Pages appended since the last checkpoint that dbstat does not
place (freed since) show as "?". Used to find where a send's pages go (docs/PERFORMANCE.md).
"""
import collections
import signal
import sqlite3
import struct
import sys


def main() -> int:
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `| head` ends it quietly
    if len(sys.argv) < 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    path, last = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 200
    try:
        log = open(path + "-wal", "rb").read()
    except OSError as error:
        print(f"wal-pages: cannot read {path}-wal: {error.strerror}", file=sys.stderr)
        return 1
    if len(log) < 32 or struct.unpack(">I", log[0:4])[0] not in (0x377F0682, 0x377F0683):
        print(f"wal-pages: {path}-wal is not a SQLite write-ahead log", file=sys.stderr)
        return 1
    page_size = struct.unpack(">I", log[8:12])[0]
    commits, current, offset = [], [], 32
    while offset + 24 + page_size <= len(log):
        page, commit_size = struct.unpack(">II", log[offset:offset + 8])
        current.append(page)
        if commit_size:
            commits.append(current)
            current = []
        offset += 24 + page_size
    if not commits:
        print("wal-pages: no commit in the log", file=sys.stderr)
        return 1
    database = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    owner = dict((page, name) for name, page in database.execute("SELECT name, pageno FROM dbstat"))
    chosen = commits[-last:]
    counts = collections.Counter(owner.get(page, "?") for commit in chosen for page in commit)
    print(f"{len(chosen)} commits of {len(commits)} in the log: {sum(map(len, chosen)) / len(chosen):.2f} pages a commit")
    for name, count in counts.most_common():
        print(f"{count / len(chosen):6.2f}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
