#!/usr/bin/env python3
"""TTFT of one demo run three ways: what the load generator's clients saw (first content chunk),
what the engines' own histogram holds (vllm:time_to_first_token_seconds: queue + prefill, from
the request's arrival at the scheduler to its first sampled token), and what the overview shows
(the gpu-agents' windowed p99 of that histogram, the highest among the service's instances).

    LOGS=/tmp/shots-logs scripts/screenshots-live.sh   # keeps demo.out/err, overview JSON, /metrics
    scripts/ttft-figures.py /tmp/shots-logs

Engine quantiles follow PromQL's histogram_quantile over the engines' cumulative buckets (all
model names and both engines summed), so they cover everything since the engines started.
"""
import json
import re
import sys
from pathlib import Path


def buckets(paths):
    acc = {}
    for p in paths:
        for line in Path(p).read_text().splitlines():
            m = re.match(r'vllm:time_to_first_token_seconds_bucket\{(.*)\} (\S+)$', line)
            if not m:
                continue
            le = re.search(r'le="([^"]+)"', m.group(1)).group(1)
            le = float('inf') if le == '+Inf' else float(le)
            acc[le] = acc.get(le, 0.0) + float(m.group(2))
    return sorted(acc.items())


def hq(q, b):
    if not b or b[-1][1] <= 0:
        return None
    rank = q * b[-1][1]
    prev_le, prev_c = 0.0, 0.0
    for le, c in b:
        if c >= rank and c > prev_c:
            if le == float('inf'):
                return prev_le
            return prev_le + (le - prev_le) * (rank - prev_c) / (c - prev_c)
        prev_le, prev_c = (le if le != float('inf') else prev_le), c
    return prev_le


def ms(x):
    return '—' if x is None else f'{x * 1000:.0f} ms'


def main(d):
    d = Path(d)
    out = (d / 'demo.out').read_text() if (d / 'demo.out').exists() else ''
    model = re.search(r'model: ([^,)]+)', out)
    print(f'model: {model.group(1) if model else "?"}')
    err = (d / 'demo.err').read_text() if (d / 'demo.err').exists() else ''
    rows = re.findall(r'^(critical|default|sheddable)\s+(?:\S+\s+){8}(\S+)s\s+(\S+)s$', err, re.M)
    if rows:
        print('client (loadgen, first evening, first content chunk):')
        for name, p50, p99 in rows[:3]:
            print(f'  {name:<10} p50 {float(p50) * 1000:.0f} ms  p99 {float(p99) * 1000:.0f} ms')
    for phase in ('during', 'after'):
        b = buckets(sorted(d.glob(f'{phase}-engine-*.prom')))
        n = b[-1][1] if b else 0
        print(f'{phase}: engine histogram since start ({n:.0f} requests): p50 {ms(hq(0.5, b))}  p99 {ms(hq(0.99, b))}')
        ov = d / f'{phase}-overview.json'
        if ov.exists():
            for s in json.loads(ov.read_text()).get('services', []):
                print(f'{phase}: overview {s["name"]}: TTFT p99 {ms(s["ttft_p99_s"])} ({s["num_instances"]} instances)')


if __name__ == '__main__':
    main(sys.argv[1] if len(sys.argv) > 1 else '/tmp/shots-logs')
