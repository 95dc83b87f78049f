import re, sys, collections
f, s, e = sys.argv[1], int(sys.argv[2], 16), int(sys.argv[3], 16)
c = collections.Counter()
for line in open(f):
    m = re.search(r"/\*([0-9a-f]{4})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", line)
    if m and s <= int(m.group(1), 16) < e:
        c[m.group(2)] += 1
print(sum(c.values()), ", ".join(f"{k} {v}" for k, v in c.most_common(30)))
