#!/usr/bin/env python3
"""Reads a Delta table with the Python `deltalake` package (delta-rs's own
reader, independent of tidemark) and prints, as one JSON object, what the
tests check: version, schema, partition columns, files, rows, history and
the `txn` version of an application id.

    read_delta.py TABLE_PATH [APP_ID]
"""
import datetime
import json
import os
import sys

from deltalake import DeltaTable


def plain(value):
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=datetime.timezone.utc)
        return value.astimezone(datetime.timezone.utc).isoformat().replace("+00:00", "Z")
    return value


def main():
    path = sys.argv[1]
    table = DeltaTable(path)
    data = table.to_pyarrow_table()
    out = {
        "version": table.version(),
        "schema": {field.name: str(field.type) for field in data.schema},
        "partition_columns": list(table.metadata().partition_columns),
        "files": [str(f) for f in table.file_uris()],
        "rows": [{k: plain(v) for k, v in row.items()} for row in data.to_pylist()],
        "history": [entry.get("operation") for entry in table.history()],
    }
    if len(sys.argv) > 2:
        out["txn_version"] = table.transaction_version(sys.argv[2])
    print(json.dumps(out))


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    # deltalake's runtime threads sometimes abort the interpreter's teardown
    # ("terminate called without an active exception"): the output is out,
    # leave without tearing down.
    os._exit(0)
