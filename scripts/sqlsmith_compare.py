#!/usr/bin/env python3
"""sqlsmith_compare.py: sorts the errors sqlsmith's queries raised on slipstream tables.

Reads the server's csvlog (from a byte offset), groups the ERRORs of database `smith` by
SQLSTATE and message (numbers and quoted names blanked), and for each kind replays up to three
of its statements against `smith_heap`, the same tables on heap. A kind passes when heap gives
the same SQLSTATE for one of them, or else when it is a documented slipstream error (the known
file: SQLSTATE, a regular expression over the message, and where it is documented, split by
tabs). Statement timeouts (57014) depend on timing and are only counted, as are errors of
statements that sample or call volatile functions, and errors a fresh session does not repeat. Exits 1 when a kind
passes neither way, and writes every kind with its verdict and a sample to the report.
"""
import argparse
import collections
import csv
import io
import re
import shlex
import subprocess
import sys

# Columns of PostgreSQL 15's csvlog that matter here.
USER, DATABASE, SEVERITY, SQLSTATE, MESSAGE, QUERY = 1, 2, 11, 12, 13, 19


def normalize(message):
    """Blanks what varies between errors of one kind: quoted names and numbers."""
    message = re.sub(r'"[^"]*"', '"_"', message)
    return re.sub(r"\b\d+(\.\d+)?\b", "N", message)


def read_errors(path, offset):
    """The (sqlstate, message, query) of every ERROR of user smith in database smith."""
    with open(path, "rb") as f:
        f.seek(offset)
        text = f.read().decode("utf-8", "replace")
    for row in csv.reader(io.StringIO(text)):
        if len(row) > QUERY and row[DATABASE] == "smith" and row[USER] == "smith" \
                and row[SEVERITY] == "ERROR" and row[QUERY]:
            yield row[SQLSTATE], row[MESSAGE], row[QUERY]


# What makes a statement's outcome depend on more than the tables' contents: sampling picks
# blocks (and a slipstream table's blocks are not heap's), and volatile or session functions.
NONDETERMINISTIC = re.compile(
    r"tablesample|random\(|timeofday|now\(|clock_timestamp|statement_timestamp|lastval|currval"
    r"|nextval|setval|pg_stat_|txid_|pg_current_|pg_backend_pid|pg_sleep|inet_client", re.I)


def sqlstate(psql, database, query):
    """The SQLSTATE the query raises in a fresh session on database, '00000' when it succeeds."""
    script = "\\set VERBOSITY sqlstate\nSET statement_timeout = '5s';\n" + query.rstrip().rstrip(";") + ";\n"
    try:
        done = subprocess.run(psql + ["-U", "smith", "-d", database, "-qAt", "-o", "/dev/null"],
                              input=script, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return "timeout"
    match = re.search(r"ERROR:\s+([0-9A-Z]{5})", done.stderr)
    if match:
        return match.group(1)
    if done.returncode != 0:
        # No SQLSTATE: psql could not run the statement at all, and no verdict can be drawn.
        sys.exit(f"cannot run a statement on {database}: {done.stderr.strip()[:300]}")
    return "00000"


def load_known(path):
    """The documented slipstream errors: (sqlstate, compiled pattern, reference)."""
    known = []
    with open(path) as f:
        for line in f:
            if line.strip() and not line.startswith("#"):
                state, pattern, reference = line.rstrip("\n").split("\t")
                known.append((state, re.compile(pattern), reference))
    return known


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--log", required=True)
    parser.add_argument("--offset", type=int, default=0)
    parser.add_argument("--known", required=True)
    parser.add_argument("--psql", required=True, help="the command that runs psql on the cluster")
    parser.add_argument("--report", required=True)
    args = parser.parse_args()
    psql = shlex.split(args.psql)
    known = load_known(args.known)

    kinds = collections.OrderedDict()
    counts = collections.Counter()
    for state, message, query in read_errors(args.log, args.offset):
        key = (state, normalize(message))
        counts[key] += 1
        samples = kinds.setdefault(key, [])
        if len(samples) < 3 and query not in (q for _, q in samples):
            samples.append((message, query))

    verdicts = collections.Counter()
    failed = []
    with open(args.report, "w") as report:
        for (state, pattern), samples in kinds.items():
            count = counts[(state, pattern)]
            if state == "57014":
                verdict = "timeout"
            else:
                on_heap = [sqlstate(psql, "smith_heap", q) for _, q in samples]
                documented = [ref for s, rx, ref in known if s == state and rx.search(samples[0][0])]
                if state in on_heap:
                    verdict = "as heap"
                elif documented:
                    verdict = "documented (" + documented[0] + ")"
                elif all(NONDETERMINISTIC.search(q) for _, q in samples):
                    verdict = "sample-dependent (heap: " + ", ".join(on_heap) + ")"
                else:
                    # Slipstream itself in a fresh session: an error that does not come back
                    # came from sqlsmith's session state (a sequence, a prepared plan).
                    again = [sqlstate(psql, "smith", q) for _, q in samples]
                    if state not in again:
                        verdict = "session-dependent (again: " + ", ".join(again) + ")"
                    else:
                        verdict = "MISMATCH (heap: " + ", ".join(on_heap) + ")"
            verdicts[verdict.split(" (")[0]] += count
            report.write(f"{count:6d}  {state}  {pattern}\n        {verdict}\n        {samples[0][1][:400]}\n")
            if verdict.startswith("MISMATCH"):
                failed.append((state, samples[0][0], verdict, samples[0][1]))

    total = sum(counts.values())
    print(f"errors logged: {total} of {len(kinds)} kinds; " +
          ", ".join(f"{v}: {n}" for v, n in sorted(verdicts.items())))
    for state, message, verdict, query in failed:
        print(f"  {state} {message}\n    {verdict}\n    {query[:600]}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
