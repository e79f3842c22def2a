#!/usr/bin/env python3
"""A minimal agent orchestrator that cooperates with brownout's agent guards (docs/AGENTS.md).

It runs one agent task: ask the model (brownout-serve's OpenAI API) which tool to call, run the
tool, repeat. Every tool run is an OpenTelemetry GenAI `execute_tool` span, exported over
OTLP/HTTP to the control plane (:4318), which follows the trace for loops and computes the tool
breakers. Before each step the orchestrator reads `/v1/features` from the serving tier and skips
tools whose breaker is open (`tool:<name>` = `disabled`); it stops when the serving tier answers
409 `agent_loop_detected`, and waits `Retry-After` on 429.

    pip install opentelemetry-sdk opentelemetry-exporter-otlp-proto-http
    BROWNOUT_INGEST_TOKEN=... python3 examples/agent_orchestrator.py \
        --otlp http://127.0.0.1:4318 --serve http://127.0.0.1:8000 --scenario loop

Scenarios: `loop` (the agent calls the same tool with the same arguments over and over: the
control plane kills it), `flaky` (the `weather` tool fails 60 % of its calls: its breaker opens),
`healthy` (distinct calls, all succeed). The model does not really choose tools here (the bundled
tiny model cannot); the scenario does, so the example runs anywhere.
"""

import argparse
import json
import os
import random
import sys
import time
import urllib.error
import urllib.request
import uuid

from opentelemetry import propagate, trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind, Status, StatusCode

TOOLS = ["web_search", "weather", "calculator"]


def http(method, url, body=None, headers=None, timeout=30):
    """(status, headers, parsed JSON or text) without raising on HTTP errors."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("content-type", "application/json")
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, hdrs, raw = r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        status, hdrs, raw = e.code, dict(e.headers), e.read()
    try:
        return status, hdrs, json.loads(raw)
    except ValueError:
        return status, hdrs, raw.decode(errors="replace")


def disabled_tools(serve):
    """Tool names whose breaker is open, from /v1/features (`tool:<name>` = `disabled`)."""
    status, _, view = http("GET", f"{serve}/v1/features")
    if status != 200 or not isinstance(view, dict):
        return set(), {}
    states = {f["name"]: f["state"] for f in view.get("features", [])}
    off = {n[len("tool:"):] for n, s in states.items() if n.startswith("tool:") and s == "disabled"}
    return off, states


def run_tool(tracer, name, args, conversation, user, scenario, rng):
    """One tool call as a GenAI `execute_tool` span (semantic conventions, development status)."""
    with tracer.start_as_current_span(f"execute_tool {name}", kind=SpanKind.INTERNAL) as span:
        span.set_attribute("gen_ai.operation.name", "execute_tool")
        span.set_attribute("gen_ai.tool.name", name)
        span.set_attribute("gen_ai.tool.type", "function")
        span.set_attribute("gen_ai.tool.call.id", uuid.uuid4().hex[:16])
        span.set_attribute("gen_ai.tool.call.arguments", json.dumps(args, sort_keys=True))
        span.set_attribute("gen_ai.conversation.id", conversation)
        span.set_attribute("enduser.id", user)
        fail = scenario == "flaky" and name == "weather" and rng.random() < 0.6
        time.sleep(0.01)
        if fail:
            span.set_attribute("error.type", "UpstreamHTTPError")
            span.set_status(Status(StatusCode.ERROR, "weather API answered 502"))
            return False
        return True


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--otlp", default="http://127.0.0.1:4318", help="control plane OTLP/HTTP base URL")
    ap.add_argument("--serve", default="http://127.0.0.1:8000", help="brownout-serve base URL")
    ap.add_argument("--token", default=os.environ.get("BROWNOUT_INGEST_TOKEN", ""), help="ingest token")
    ap.add_argument("--scenario", choices=["loop", "flaky", "healthy"], default="loop")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--pause", type=float, default=0.2, help="seconds between steps")
    ap.add_argument("--user", default="alice")
    ap.add_argument("--seed", type=int, default=7)
    a = ap.parse_args()
    rng = random.Random(a.seed)

    headers = {"authorization": f"Bearer {a.token}"} if a.token else {}
    provider = TracerProvider(resource=Resource.create({"service.name": "agent-orchestrator"}))
    # Simple (synchronous) export so the control plane sees each call at once.
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"{a.otlp}/v1/traces", headers=headers)))
    trace.set_tracer_provider(provider)
    tracer = trace.get_tracer("agent_orchestrator")

    conversation = f"conv-{uuid.uuid4().hex[:12]}"
    result = {"conversation": conversation, "scenario": a.scenario, "steps": 0, "stopped_by": None,
              "skipped_tools": [], "tool_failures": 0}
    with tracer.start_as_current_span("invoke_agent", kind=SpanKind.INTERNAL) as root:
        root.set_attribute("gen_ai.operation.name", "invoke_agent")
        root.set_attribute("gen_ai.conversation.id", conversation)
        for step in range(a.steps):
            off, states = disabled_tools(a.serve)
            tools = [t for t in TOOLS if t not in off]
            if off:
                result["skipped_tools"] = sorted(off)
            carrier = {}
            propagate.inject(carrier)  # traceparent: the serving tier can abort this trace too
            body = {
                "messages": [{"role": "user", "content": "Plan my trip."}],
                "max_tokens": 4, "temperature": 0,
                "tools": [{"type": "function", "function": {"name": t, "parameters": {"type": "object"}}} for t in tools],
            }
            status, hdrs, resp = http("POST", f"{a.serve}/v1/chat/completions", body, {
                "x-brownout-user": a.user,
                "x-brownout-conversation": conversation,
                "x-brownout-criticality": "default",
                **carrier,
            })
            code = resp.get("error", {}).get("code") if isinstance(resp, dict) else None
            if status == 409 and code == "agent_loop_detected":
                result["stopped_by"] = "agent_loop_detected"
                break
            if status == 429:
                wait = float(hdrs.get("Retry-After", hdrs.get("retry-after", "1")))
                time.sleep(min(wait, 5.0))
                continue
            if status == 503 and code == "tool_disabled":
                result["skipped_tools"] = sorted(set(result["skipped_tools"]) | {resp["error"].get("tool", "")})
                continue
            if status != 200:
                result["stopped_by"] = f"http {status} {code}"
                break
            if a.scenario == "loop":
                name, args = "web_search", {"q": "cheapest flight to Lisbon"}
            elif a.scenario == "flaky":
                name, args = ("weather" if "weather" in tools else "calculator"), {"city": "Lisbon", "day": step}
            else:
                name, args = TOOLS[step % len(TOOLS)], {"step": step}
            if not run_tool(tracer, name, args, conversation, a.user, a.scenario, rng):
                result["tool_failures"] += 1
            result["steps"] = step + 1
            time.sleep(a.pause)
            result["features"] = {k: v for k, v in states.items() if k.startswith("tool:")}
    provider.shutdown()
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
