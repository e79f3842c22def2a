#!/usr/bin/env python3
"""drain3 as a command for the Loghub scorer (one `id<TAB>template` line per input line).

    drain3_loghub.py INPUT_FILE > OUTPUT            (pip install drain3==0.9.11)

drain3 runs with its documented defaults (`TemplateMinerConfig()`: depth 4, sim_th 0.4,
max_children 100, no masking), one configuration for every dataset, like brownout. Each line
gets its cluster's final template, as `brownout patterns mine FILE` prints them.
"""

import sys

from drain3 import TemplateMiner
from drain3.template_miner_config import TemplateMinerConfig


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: drain3_loghub.py INPUT_FILE")
    miner = TemplateMiner(config=TemplateMinerConfig())
    ids = []
    with open(sys.argv[1], "r", encoding="utf-8", errors="replace", newline="\n") as f:
        for line in f:
            if line.endswith("\n"):
                line = line[:-1]
            ids.append(miner.add_log_message(line)["cluster_id"])
    templates = {c.cluster_id: c.get_template() for c in miner.drain.clusters}
    sys.stdout.writelines(f"{i}\t{templates[i]}\n" for i in ids)


if __name__ == "__main__":
    main()
