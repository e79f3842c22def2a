#!/usr/bin/env python3
"""Validates the Prometheus Operator objects (monitoring.coreos.com/v1) of rendered manifests
against the operator's published CRD schemas, as generated into the models of the PyPI package
cloudcoil.models.prometheus_operator. Strict: a field the schema lacks fails, like
`kubernetes-validate --strict` for the built-in kinds (the models ignore unknown fields, so each
object is validated, dumped back and compared with what was read).

    python3 deploy/kubernetes/validate-crds.py rendered.yaml...

Prints one line per object; exits 1 when one does not validate, 2 when the package is missing.
Objects of other API groups are left to kubernetes-validate."""
import sys

import yaml

try:
    from cloudcoil.models.prometheus_operator import v1
except ImportError as e:
    print(f"validate-crds: {e}: pip install 'cloudcoil.models.prometheus_operator' "
          "(scripts/test.sh installs it)", file=sys.stderr)
    sys.exit(2)


def differences(want, got, path="$"):
    """What `got` (the model's dump) lacks or changed against `want` (the manifest)."""
    if isinstance(want, dict) and isinstance(got, dict):
        for k, v in want.items():
            if k not in got:
                yield f"{path}.{k}: not in the schema"
            else:
                yield from differences(v, got[k], f"{path}.{k}")
    elif isinstance(want, list) and isinstance(got, list) and len(want) == len(got):
        for i, (a, b) in enumerate(zip(want, got)):
            yield from differences(a, b, f"{path}[{i}]")
    elif want != got:
        yield f"{path}: {want!r} read back as {got!r}"


failed = 0
checked = 0
for name in sys.argv[1:]:
    with open(name) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    for d in docs:
        if not str(d.get("apiVersion", "")).startswith("monitoring.coreos.com/"):
            continue
        what = f"{d['kind']}/{d.get('metadata', {}).get('name')}"
        model = getattr(v1, d["kind"], None) if d["apiVersion"] == "monitoring.coreos.com/v1" else None
        if model is None:
            print(f"ERROR {name}: {what}: no schema for {d['apiVersion']} {d['kind']}")
            failed += 1
            continue
        try:
            got = model.model_validate(d).model_dump(by_alias=True, exclude_unset=True, mode="json")
        except Exception as e:  # pydantic's ValidationError names the field and the reason
            print(f"ERROR {name}: {what}: {e}")
            failed += 1
            continue
        bad = list(differences(d, got))
        checked += 1
        if bad:
            print(f"ERROR {name}: {what}: " + "; ".join(bad))
            failed += 1
        else:
            print(f"INFO {name}: {what} passed against monitoring.coreos.com/v1")
print(f"validate-crds: {checked} checked, {failed} failed")
sys.exit(1 if failed else 0)
