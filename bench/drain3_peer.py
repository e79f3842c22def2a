#!/usr/bin/env python3
"""Runs drain3 (PyPI `drain3`) over log files as the peer of `brownout patterns bench`.

For each FILE it prints one JSON object per line on stdout:
    {"file": FILE, "lines": N, "cpu_s": S, "ids": [cluster id of each line, in order],
     "content_cpu_s": S2, "content_ids": [...]}
cpu_s is time.process_time() around the mining loop only (reading the file is excluded).
"ids" is drain3 on the raw lines (the same input brownout gets); "content_ids" is drain3 on the
message content after a per-source header regex (LogPai's log_format way of running Drain:
tuned per source, so it is drain3's best case, not a one-configuration run).

drain3 runs with its documented defaults (depth 4, sim_th 0.4, max_children 100) plus the
masking rules of drain3's own example config (examples/drain3.ini), one configuration for all
files, like brownout's miner.

    pip install drain3 && python3 bench/drain3_peer.py testdata/logs/hdfs.log ...
"""
import json
import os
import re
import sys
import time

from drain3 import TemplateMiner
from drain3.masking import MaskingInstruction
from drain3.template_miner_config import TemplateMinerConfig

# drain3's examples/drain3.ini masking list.
MASKS = [
    (r"((?<=[^A-Za-z0-9])|^)(([0-9a-f]{2,}:){3,}([0-9a-f]{2,}))((?=[^A-Za-z0-9])|$)", "ID"),
    (r"((?<=[^A-Za-z0-9])|^)(\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3})((?=[^A-Za-z0-9])|$)", "IP"),
    (r"((?<=[^A-Za-z0-9])|^)([0-9a-f]{6,} ?){3,}((?=[^A-Za-z0-9])|$)", "SEQ"),
    (r"((?<=[^A-Za-z0-9])|^)([0-9A-F]{4} ?){4,}((?=[^A-Za-z0-9])|$)", "SEQ"),
    (r"((?<=[^A-Za-z0-9])|^)(0x[a-f0-9A-F]+)((?=[^A-Za-z0-9])|$)", "HEX"),
    (r"((?<=[^A-Za-z0-9])|^)([\-\+]?\d+)((?=[^A-Za-z0-9])|$)", "NUM"),
    (r"(?<=executed cmd )(\".+?\")", "CMD"),
]


# LogPai-style per-source header regexes (the peer's best case).
HEADERS = {
    "hdfs": r"^\d{6} \d{6} \d+ \w+ [^:]+: ",
    "spark": r"^\d\d/\d\d/\d\d \d\d:\d\d:\d\d \w+ [^:]+: ",
    "openssh": r"^\w{3} +\d+ \d\d:\d\d:\d\d \S+ sshd\[\d+\]: ",
    "android": r"^\d\d-\d\d \d\d:\d\d:\d\d\.\d+ +\d+ +\d+ \w [^:]+: ",
    "windows": r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d, \w+ +\w+ +",
    "syslog": r"^\w{3} +\d+ \d\d:\d\d:\d\d \S+ [^:]+: ",
    "agent": r"^\S+ \w+ [^:]+: ",
}


def miner():
    cfg = TemplateMinerConfig()
    cfg.profiling_enabled = False
    cfg.masking_instructions = [MaskingInstruction(p, m) for p, m in MASKS]
    return TemplateMiner(config=cfg)


def main():
    for path in sys.argv[1:]:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = [l.rstrip("\n") for l in f]
        m = miner()
        t0 = time.process_time()
        ids = [m.add_log_message(l)["cluster_id"] for l in lines]
        cpu = time.process_time() - t0
        name = os.path.splitext(os.path.basename(path))[0]
        rx = re.compile(HEADERS.get(name, r"^"))
        content = [rx.sub("", l, count=1) for l in lines]
        m = miner()
        t0 = time.process_time()
        cids = [m.add_log_message(l)["cluster_id"] for l in content]
        ccpu = time.process_time() - t0
        print(json.dumps({"file": path, "lines": len(lines), "cpu_s": cpu, "ids": ids, "content_cpu_s": ccpu, "content_ids": cids}), flush=True)


if __name__ == "__main__":
    main()
