#!/usr/bin/env python3
"""Compacts a Delta table with the Python `deltalake` package, as another
writer (a maintenance job) would while a tidemark query writes it, and
prints the optimize metrics as JSON.

    optimize_delta.py TABLE_PATH
"""
import json
import sys

from deltalake import DeltaTable


def main():
    table = DeltaTable(sys.argv[1])
    metrics = table.optimize.compact()
    print(json.dumps({"metrics": metrics, "version": table.version()}, default=str))


if __name__ == "__main__":
    main()
