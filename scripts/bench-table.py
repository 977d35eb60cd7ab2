#!/usr/bin/env python3
"""Turns the bench log into a Markdown table (stdlib only).

    bench-table.py bench.log [out.md]

Reads the machine-readable lines the bench binaries print, one per line:

    ROW|<build>|<operation>|<crate_us>|<floor_name>|<floor_us>|<bytes_moved>|<target>
    INFO|<free text>

and prints one table grouped by operation (builds in the order baseline, p1, p12, p123,
all; unknown builds after them), then the INFO lines verbatim under "Notes". Everything
else in the log (banners, harness output) is ignored. The table also goes to out.md if
given. Targets it understands (see check_target) are checked and marked met or MISSED;
any other is marked "not checked here".
"""

import math
import re
import sys

BUILD_ORDER = ["baseline", "p1", "p12", "p123", "all"]
COLUMNS = ["operation", "build", "crate (us)", "floor", "floor (us)", "crate/floor",
           "bytes moved", "target"]


def sig3(v):
    """A float with 3 significant digits, in fixed point (no exponent for usual values)."""
    if v is None or math.isnan(v):
        return "-"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    if v == 0:
        return "0"
    exp = math.floor(math.log10(abs(v)))
    if exp >= 2:  # 123.4 -> 123, 12345 -> 12,300
        return f"{int(round(v, 2 - exp)):,}"
    if exp < -6:
        return f"{v:.2e}"
    return f"{v:.{2 - exp}f}"


def fmt_bytes(n):
    if n is None or n < 0:
        return "-"
    if n < 1024:
        return f"{n} B"
    for unit, scale in (("KiB", 1 << 10), ("MiB", 1 << 20), ("GiB", 1 << 30)):
        if n < scale * 1024 or unit == "GiB":
            return f"{sig3(n / scale)} {unit}"
    return str(n)


def ratio(crate_us, floor_us):
    if crate_us is None or floor_us is None or not floor_us > 0:
        return None
    return crate_us / floor_us


def compare(op, value, bound):
    return {"<=": value <= bound, "<": value < bound, ">=": value >= bound, ">": value > bound}[op]


def check_target(target, row, r):
    """True/False for a target we understand, None otherwise (marked "not checked").

    Understood: "<=1.2x floor" (crate/floor); ">=0.9x floor bandwidth" and ">=0.9 of
    ideal" (floor/crate, the floor being the ideal time); "<=200 us ..." and "<1000us, aim
    300us" (the crate's time; the first bound counts); "<=1us, 0 B" (also no bytes moved);
    ">=40 GB/s" (bytes moved over the crate's time); "<1% overhead" (crate/floor - 1).
    """
    t = target.strip().replace(" ", "").lower()
    crate_us, floor_us, nbytes = row["crate_us"], row["floor_us"], row["bytes"]
    m = re.fullmatch(r"(<=|<)([0-9.]+)x(floor)?", t)
    if m and r is not None:
        return compare(m.group(1), r, float(m.group(2)))
    m = re.fullmatch(r"(>=|>)([0-9.]+)x?(floorbandwidth|ofideal)", t)
    if m and crate_us and floor_us:
        return compare(m.group(1), floor_us / crate_us, float(m.group(2)))
    m = re.fullmatch(r"(<=|<)([0-9.]+)(us|µs)(,0b)?([,(].*)?", t)
    if m and crate_us is not None:
        met = compare(m.group(1), crate_us, float(m.group(2)))
        if m.group(4):
            met = met and nbytes == 0
        return met
    m = re.fullmatch(r"(>=|>)([0-9.]+)gb/s", t)
    if m and crate_us and nbytes and nbytes > 0:
        return compare(m.group(1), nbytes / (crate_us * 1e-6) / 1e9, float(m.group(2)))
    m = re.fullmatch(r"(<=|<)([0-9.]+)%overhead", t)
    if m and r is not None:
        return compare(m.group(1), (r - 1.0) * 100.0, float(m.group(2)))
    return None


def to_float(s):
    try:
        return float(s)
    except ValueError:
        return None


def to_int(s):
    try:
        return int(s)
    except ValueError:
        return None


def cell(s):
    return str(s).replace("|", "\\|")


def parse(lines):
    rows, notes, warnings = [], [], []
    for lineno, raw in enumerate(lines, 1):
        line = raw.rstrip("\r\n").strip()
        if line.startswith("INFO|"):
            if line not in notes:  # the same note from each build is listed once
                notes.append(line)
        elif line.startswith("ROW|"):
            parts = line.split("|", 7)  # the target (last field) may itself hold '|'
            if len(parts) != 8:
                warnings.append(f"line {lineno}: expected 8 fields, got {len(parts)}: {line}")
                continue
            _, build, op, crate_us, floor_name, floor_us, nbytes, target = parts
            row = {
                "build": build.strip(), "op": op.strip(), "crate_us": to_float(crate_us),
                "floor_name": floor_name.strip(), "floor_us": to_float(floor_us),
                "bytes": to_int(nbytes.strip()), "target": target.strip(),
            }
            if row["crate_us"] is None or row["floor_us"] is None or row["bytes"] is None:
                warnings.append(f"line {lineno}: unparsable number: {line}")
            rows.append(row)
    return rows, notes, warnings


def render(rows, notes, warnings, source):
    out = [f"## Bench results ({source})", ""]
    if not rows:
        out += ["_No ROW lines found._", ""]
    else:
        out.append("| " + " | ".join(COLUMNS) + " |")
        out.append("|" + "|".join(["---"] * 2 + ["---:"] + ["---"] + ["---:"] * 3 + ["---"]) + "|")
        ops = list(dict.fromkeys(r["op"] for r in rows))  # first-appearance order
        extra = [b for b in dict.fromkeys(r["build"] for r in rows) if b not in BUILD_ORDER]
        rank = {b: i for i, b in enumerate(BUILD_ORDER + extra)}
        for op in ops:
            group = sorted((r for r in rows if r["op"] == op), key=lambda r: rank[r["build"]])
            for r in group:
                rt = ratio(r["crate_us"], r["floor_us"])
                target = r["target"] or "-"
                ok = check_target(target, r, rt)
                if ok is True:
                    target += " (met)"
                elif ok is False:
                    target += " (**MISSED**)"
                elif target != "-":
                    target += " (not checked here)"
                out.append("| " + " | ".join(cell(c) for c in [
                    op, r["build"], sig3(r["crate_us"]), r["floor_name"] or "-",
                    sig3(r["floor_us"]), "-" if rt is None else sig3(rt) + "x",
                    fmt_bytes(r["bytes"]), target,
                ]) + " |")
        out.append("")
    if notes:
        out += ["### Notes", "", "```"] + notes + ["```", ""]
    if warnings:
        out += ["### Parse warnings", ""] + [f"- {cell(w)}" for w in warnings] + [""]
    return "\n".join(out)


def main(argv):
    if len(argv) not in (2, 3) or argv[1] in ("-h", "--help"):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    with open(argv[1], encoding="utf-8", errors="replace") as f:
        rows, notes, warnings = parse(f)
    for w in warnings:
        print(f"bench-table: {w}", file=sys.stderr)
    text = render(rows, notes, warnings, argv[1].rsplit("/", 1)[-1])
    print(text)
    if len(argv) == 3:
        with open(argv[2], "w", encoding="utf-8") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
