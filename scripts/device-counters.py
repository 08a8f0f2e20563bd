#!/usr/bin/env python3
"""The per-device counters' list (proto/include/graphd/device_counters.def)
against what must follow it outside the C code:

- proto/graphd.proto: DeviceCounters has a uint64 field of each entry's
  name and number, and no scalar field the list lacks (its repeated
  fields are the latency histogram's bounds and counts, not counters);
- the entries themselves: names and numbers unique, tokens known, a TAIL
  entry held at its own name, Prometheus names as Prometheus wants them
  (graphd_ first, a counter's ending in _total, seconds and bytes named);
- docs/operator.md: the table between its "device counters" markers is the
  one this script writes from the list;
- docs/schemas/graphctl-stats.schema.json: a device's properties hold one
  integer per entry, described by its help, beside the keys graphctl
  writes itself (HAND_KEYS), and require them all.

Usage: scripts/device-counters.py [check | write] [--root DIR]
  check   prints each disagreement and exits 1; exits 0 when there is none
  write   rewrites the operator guide's table and the schema from the
          list, then checks
--root names the tree (default: this script's). Standard library only."""
import json
import os
import re
import sys

DEF = "proto/include/graphd/device_counters.def"
PROTO = "proto/graphd.proto"
GUIDE = "docs/operator.md"
SCHEMA = "docs/schemas/graphctl-stats.schema.json"
FILES = [DEF, PROTO, GUIDE, SCHEMA]

COLUMNS = ["name", "field", "kind", "unit", "source", "place", "path", "form", "prometheus",
           "help"]
TOKENS = {"kind": {"COUNTER", "GAUGE"}, "unit": {"NS", "BYTES", "COUNT"},
          "source": {"TALLY", "KEPT", "READ"}, "place": {"OLD", "TAIL"},
          "form": {"LINE", "PART", "NONE"}}
UNIT_WORD = {"NS": "ns", "BYTES": "bytes", "COUNT": "count"}

# A device's keys in graphctl stats --json that are not counters of the
# list: graphctl writes them itself.
HAND_KEYS = ["device", "uuid", "state", "figures_age_ms", "replay_latency_ns"]

BEGIN = "<!-- device counters: written by scripts/device-counters.py from device_counters.def -->"
END = "<!-- end of device counters -->"


def read(root, rel):
    with open(os.path.join(root, rel), encoding="utf-8") as f:
        return f.read()


def c_strings(arg):
    """The text of an argument made of adjacent C string literals."""
    parts = re.findall(r'"((?:[^"\\]|\\.)*)"', arg)
    return "".join(p.replace('\\"', '"').replace("\\\\", "\\") for p in parts)


def split_call(text, start):
    """The arguments of the call whose "(" is at text[start], split at its
    top-level commas, and the index after its ")"."""
    args, cur, depth, k = [], [], 1, start + 1
    while depth:
        ch = text[k]
        if ch == '"':
            end = k + 1
            while text[end] != '"':
                end += 2 if text[end] == "\\" else 1
            cur.append(text[k:end + 1])
            k = end + 1
            continue
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if not depth:
                break
        elif ch == "," and depth == 1:
            args.append("".join(cur).strip())
            cur = []
            k += 1
            continue
        cur.append(ch)
        k += 1
    args.append("".join(cur).strip())
    return args, k + 1


def parse_list(text):
    """The entries of device_counters.def, in order, as dicts of COLUMNS."""
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    entries, i, key = [], 0, "GRAPHD_DEVICE_COUNTER("
    while (j := text.find(key, i)) >= 0:
        args, i = split_call(text, j + len(key) - 1)
        if len(args) != len(COLUMNS):
            raise ValueError(f"an entry has {len(args)} columns, not {len(COLUMNS)}: {args[:1]}")
        e = dict(zip(COLUMNS, args))
        e["field"] = int(e["field"])
        e["prometheus"] = c_strings(e["prometheus"])
        e["help"] = c_strings(e["help"])
        entries.append(e)
    return entries


def proto_fields(text, message="DeviceCounters"):
    """{name: (type, number, repeated)} of a message of graphd.proto."""
    m = re.search(r"message\s+" + message + r"\s*\{(.*?)\n\}", text, flags=re.S)
    if not m:
        raise ValueError(f"graphd.proto has no message {message}")
    body = re.sub(r"//[^\n]*", "", m.group(1))
    out = {}
    for rep, typ, name, num in re.findall(r"(repeated\s+)?(\w+)\s+(\w+)\s*=\s*(\d+)\s*;", body):
        out[name] = (typ, int(num), bool(rep))
    return out


def check_entries(entries):
    bad = []
    seen_names, seen_fields = set(), set()
    for e in entries:
        n = e["name"]
        if n in seen_names:
            bad.append(f"{n}: listed twice")
        if e["field"] in seen_fields:
            bad.append(f"{n}: field number {e['field']} taken by an earlier entry")
        seen_names.add(n)
        seen_fields.add(e["field"])
        for col, allowed in TOKENS.items():
            if e[col] not in allowed:
                bad.append(f"{n}: {col} is {e[col]}, not one of {sorted(allowed)}")
        if e["place"] == "TAIL" and e["path"] != n:
            bad.append(f"{n}: a TAIL entry is held at its own name, not at {e['path']}")
        if (e["form"] == "NONE") != (e["prometheus"] == ""):
            bad.append(f"{n}: a Prometheus name goes with LINE or PART, and only with them")
        if (e["unit"] == "NS") != n.endswith("_ns"):
            bad.append(f"{n}: a count of nanoseconds, and only one, ends in _ns")
        p = e["prometheus"]
        if p and not re.fullmatch(r"graphd_[a-z0-9_]+", p):
            bad.append(f"{n}: Prometheus name {p!r} does not start graphd_")
        if e["form"] == "LINE":
            if (e["kind"] == "COUNTER") != p.endswith("_total"):
                bad.append(f"{n}: {p}: a counter's name, and only a counter's, ends in _total")
            if e["unit"] == "NS" and "_seconds" not in p:
                bad.append(f"{n}: {p}: nanoseconds are written as seconds, so named")
            if e["unit"] == "BYTES" and "_bytes" not in p:
                bad.append(f"{n}: {p}: a byte count is named _bytes")
        if not e["help"].endswith("."):
            bad.append(f"{n}: its help is a sentence, ending in a full stop")
    # The TAIL entries append to graphd_device_record: after every OLD one.
    places = [e["place"] for e in entries]
    if "TAIL" in places and "OLD" in places[places.index("TAIL"):]:
        bad.append("an OLD entry follows a TAIL one: new counters go at the end")
    return bad


def check_proto(entries, fields):
    bad = []
    listed = {e["name"]: e for e in entries}
    for n, e in listed.items():
        if n not in fields:
            bad.append(f"{n}: DeviceCounters in {PROTO} has no such field")
            continue
        typ, num, rep = fields[n]
        if typ != "uint64" or rep:
            bad.append(f"{n}: DeviceCounters.{n} is {'repeated ' if rep else ''}{typ}, not uint64")
        if num != e["field"]:
            bad.append(f"{n}: DeviceCounters.{n} is field {num}, the list says {e['field']}")
    for n, (typ, num, rep) in fields.items():
        if not rep and n not in listed:
            bad.append(f"DeviceCounters.{n} (field {num}) is not in {DEF}")
    return bad


def prom_cell(e):
    if e["form"] == "LINE":
        return f"`{e['prometheus']}`"
    if e["form"] == "PART":
        return f"in `{e['prometheus']}`"
    return "-"


def guide_table(entries):
    rows = ["| counter | field | kind | unit | Prometheus | what |",
            "| --- | --- | --- | --- | --- | --- |"]
    for e in entries:
        rows.append(f"| `{e['name']}` | {e['field']} | {e['kind'].lower()} | "
                    f"{UNIT_WORD[e['unit']]} | {prom_cell(e)} | {e['help']} |")
    return "\n".join(rows)


def guide_with_table(text, entries):
    b, e = text.find(BEGIN), text.find(END)
    if b < 0 or e < b:
        raise ValueError(f"{GUIDE} lacks the markers {BEGIN!r} ... {END!r}")
    return text[:b + len(BEGIN)] + "\n" + guide_table(entries) + "\n" + text[e:]


def schema_with_counters(text, entries):
    s = json.loads(text)
    item = s["properties"]["devices"]["items"]
    props = item["properties"]
    new = {k: props[k] for k in HAND_KEYS if k in props}
    for e in entries:
        unit = {"NS": " In nanoseconds.", "BYTES": " In bytes."}.get(e["unit"], "")
        new[e["name"]] = {"type": "integer", "minimum": 0, "description": e["help"] + unit}
    item["properties"] = new
    item["required"] = [k for k in HAND_KEYS if k in props] + [e["name"] for e in entries]
    return json.dumps(s, indent=2, ensure_ascii=False) + "\n"


def check(root):
    entries = parse_list(read(root, DEF))
    bad = check_entries(entries) + check_proto(entries, proto_fields(read(root, PROTO)))
    guide = read(root, GUIDE)
    try:
        if guide_with_table(guide, entries) != guide:
            bad.append(f"{GUIDE}: the device counters' table is not the list's "
                       "(scripts/device-counters.py write)")
    except ValueError as err:
        bad.append(str(err))
    schema = read(root, SCHEMA)
    if schema_with_counters(schema, entries) != schema:
        bad.append(f"{SCHEMA}: a device's counters are not the list's "
                   "(scripts/device-counters.py write)")
    return bad


def write(root):
    entries = parse_list(read(root, DEF))
    for rel, make in ((GUIDE, guide_with_table), (SCHEMA, schema_with_counters)):
        old = read(root, rel)
        new = make(old, entries)
        if new != old:
            with open(os.path.join(root, rel), "w", encoding="utf-8") as f:
                f.write(new)
            print(f"device-counters: wrote {rel}")


def main(argv):
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    cmd = "check"
    args = list(argv)
    while args:
        a = args.pop(0)
        if a == "--root" and args:
            root = args.pop(0)
        elif a in ("check", "write"):
            cmd = a
        else:
            print("usage: scripts/device-counters.py [check | write] [--root DIR]", file=sys.stderr)
            return 2
    if cmd == "write":
        write(root)
    bad = check(root)
    for b in bad:
        print(f"device-counters: {b}")
    if not bad:
        print(f"device-counters: {len(parse_list(read(root, DEF)))} counters agree with "
              f"{PROTO}, {GUIDE} and {SCHEMA}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
