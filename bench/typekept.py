#!/usr/bin/env python3
"""Exception types in mined templates: for each true template that starts with an exception type,
whether every line's mined template holds that type as a token; and how many mined templates
hold lines of two true kinds that start with different types.

    python3 bench/typekept.py BROWNOUT_BIN testdata/failures/llm_raw.log testdata/failures/llm_raw.truth
"""
import subprocess, sys, re
b, log, truth = sys.argv[1:4]
out = subprocess.run([b, "patterns", "mine", log], capture_output=True, text=True).stdout.splitlines()
tr = open(truth).read().splitlines()
kinds = {}
for o, t in zip(out, tr):
    ty = t.split(" ")[0].rstrip(":")
    if not re.search(r"(Error|Exception|Timeout|Exit|Interrupt|Warning|Fault|Failure|Exceeded)$", ty): continue
    tid, tpl = o.split("\t", 1)
    toks = [x.rstrip(":") for x in tpl.split(" ")]
    kinds.setdefault(t, set()).add(ty in toks)
kept = sum(1 for v in kinds.values() if v == {True})
tys = {}
for o, t in zip(out, tr):
    tys.setdefault(o.split("\t")[0], set()).add(t.split(" ")[0].rstrip(":"))
merged = sum(1 for v in tys.values() if len(v) > 1)
print(f"{log}: kinds with a type {len(kinds)}, type kept in all lines' templates: {kept}; templates holding >1 type: {merged}")
