#!/usr/bin/env python3
"""Markdown report of a bench/loghub.sh run: loghub_report.py OUT_DIR ROUNDS BIN > report.md"""

import json
import os
import statistics
import sys


def load(out, name):
    with open(os.path.join(out, name)) as f:
        return json.load(f)


def fmt(x):
    return "-" if x is None else f"{x:.3f}"


def accuracy_table(b, d, title):
    rows = [f"#### {title}", "",
            "| Dataset | brownout GA | FGA | PA | FTA | drain3 GA | FGA | PA | FTA |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    dres = {r["dataset"]: r for r in d["results"]}
    for r in b["results"]:
        q = dres.get(r["dataset"], {})
        rows.append(f"| {r['dataset']} | {fmt(r.get('GA'))} | {fmt(r.get('FGA'))} | "
                    f"{fmt(r.get('PA'))} | {fmt(r.get('FTA'))} | {fmt(q.get('GA'))} | "
                    f"{fmt(q.get('FGA'))} | {fmt(q.get('PA'))} | {fmt(q.get('FTA'))} |")
    bs, ds = b["summary"], d["summary"]
    rows.append(f"| **Average** | **{fmt(bs['avg_GA'])}** | **{fmt(bs['avg_FGA'])}** | "
                f"**{fmt(bs['avg_PA'])}** | **{fmt(bs['avg_FTA'])}** | {fmt(ds['avg_GA'])} | "
                f"{fmt(ds['avg_FGA'])} | {fmt(ds['avg_PA'])} | {fmt(ds['avg_FTA'])} |")
    return "\n".join(rows) + "\n"


def main():
    out, rounds, binary = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    bc, dc = load(out, "brownout-content.json"), load(out, "drain3-content.json")
    br, dr = load(out, "brownout-raw.json"), load(out, "drain3-raw.json")
    meta = bc["meta"]
    print(f"### Loghub-2k, corrected ground truth ({len(bc['results'])} datasets)\n")
    print(f"{meta['date']}, {meta['machine']}, {meta['cpu_count']} CPUs, python "
          f"{meta['python']}; brownout = `{binary} patterns mine {{input}}`, drain3 0.9.11 "
          f"defaults = `python3 bench/drain3_loghub.py {{input}}`.\n")
    print(accuracy_table(bc, dc, "Message content (the scorer's default input)"))
    print(accuracy_table(br, dr, "Raw lines with their headers (`--input raw`)"))
    rows = ["#### Throughput (lines per CPU-second, the scorer's throughput mode)", "",
            "| Round | brownout | drain3 | ratio |", "|---|---:|---:|---:|"]
    ratios = []
    per_round = []
    for r in range(1, rounds + 1):
        b = load(out, f"brownout-thr-{r}.json")
        d = load(out, f"drain3-thr-{r}.json")
        bl, dl = b["summary"]["throughput_cpu_lps"], d["summary"]["throughput_cpu_lps"]
        ratios.append(bl / dl)
        per_round.append((bl / dl, b, d))
        rows.append(f"| {r} | {bl:,.0f} | {dl:,.0f} | {bl / dl:.1f}× |")
    med = statistics.median(ratios)
    rows.append(f"| **median** | | | **{med:.1f}×** |")
    print("\n".join(rows) + "\n")
    # The median round, per dataset.
    _, b, d = sorted(per_round, key=lambda x: x[0])[len(per_round) // 2]
    dres = {r["dataset"]: r for r in d["results"]}
    rows = [f"Median round per dataset (input: each 2k file repeated "
            f"×{b['meta']['throughput_scale']}, median of {b['meta']['throughput_repeat']} runs "
            f"each; CPU time includes process start-up):", "",
            "| Dataset | brownout lines/CPU-s | drain3 lines/CPU-s | ratio |",
            "|---|---:|---:|---:|"]
    for r in b["results"]:
        q = dres.get(r["dataset"], {})
        bl, dl = r.get("throughput_cpu_lps"), q.get("throughput_cpu_lps")
        ratio = f"{bl / dl:.1f}×" if bl and dl else "-"
        rows.append(f"| {r['dataset']} | {bl or 0:,.0f} | {dl or 0:,.0f} | {ratio} |")
    print("\n".join(rows))
    inproc = os.path.join(out, "inprocess.md")
    if os.path.exists(inproc):
        print("\n#### In-process, each line mined once by a fresh miner (`brownout patterns bench`)\n")
        print("Content lines as corpora; the peer is bench/drain3_peer.py (drain3 defaults plus the "
              "masking of its example config, one pass); its two accuracy columns coincide "
              "(there is no header to strip).\n")
        with open(inproc) as f:
            print(f.read())


if __name__ == "__main__":
    main()
