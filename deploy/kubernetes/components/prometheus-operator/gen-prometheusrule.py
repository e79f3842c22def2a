#!/usr/bin/env python3
"""Writes prometheusrule.yaml beside this file: one PrometheusRule per alerts/*.yml, its
spec.groups the file's groups as they are. Run it after changing alerts/:

    python3 deploy/kubernetes/components/prometheus-operator/gen-prometheusrule.py

tests/it/deploy_manifests.rs fails when prometheusrule.yaml and alerts/ say different things.
Needs PyYAML (pip install pyyaml; kubernetes-validate brings it)."""
import pathlib
import sys

import yaml

here = pathlib.Path(__file__).resolve().parent
alerts = here.parents[3] / "alerts"
docs = []
for f in sorted(alerts.glob("*.yml")):
    groups = yaml.safe_load(f.read_text())["groups"]
    docs.append({
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "brownout-" + f.stem,
            "annotations": {"brownout/source-file": "alerts/" + f.name},
        },
        "spec": {"groups": groups},
    })
out = here / "prometheusrule.yaml"
header = ("# Generated from alerts/*.yml by gen-prometheusrule.py beside this file; do not edit.\n"
          "# tests/it/deploy_manifests.rs checks that it matches alerts/.\n")
out.write_text(header + yaml.safe_dump_all(docs, sort_keys=False, width=1000, allow_unicode=True))
print(f"wrote {out} ({len(docs)} rules files)", file=sys.stderr)
