import re, sys, collections
lines = []
for line in open(sys.argv[1]):
    m = re.search(r"/\*([0-9a-f]{4})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)([^;]*);", line)
    if m:
        lines.append((int(m.group(1), 16), m.group(2), m.group(3)))
for addr, op, rest in lines:
    if op == "BRA":
        t = re.search(r"0x([0-9a-f]+)", rest)
        if t and int(t.group(1), 16) < addr:
            lo = int(t.group(1), 16)
            c = collections.Counter(o for a, o, _ in lines if lo <= a <= addr)
            if c["HGMMA"]:
                print(f"loop {lo:x}-{addr:x}: {sum(c.values())} instr, " + ", ".join(f"{k} {v}" for k, v in c.most_common(12)))
