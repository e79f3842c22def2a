#!/usr/bin/env python3
"""Writes labelled corpora of failure messages and of log formats beside Loghub's.

    python3 bench/gen_failures.py [--out testdata]

- failures/llm_messages.log: failure messages of the kinds LLM apps, serving engines and agent
  tools emit (Python exceptions of torch, vLLM, the openai and anthropic SDKs, httpx, requests,
  redis, grpc, pydantic, json; Java exceptions; CUDA and NCCL errors; tool timeouts), 34 kinds,
  bare messages (as a failure event's `message` carries them).
- failures/llm_raw.log: the same messages as raw log lines, each under one of five common
  headers (Python logging with and without a logger, `LEVEL:logger:`, RFC 3164 syslog,
  uvicorn's `LEVEL:` prefix).
- failures/tracebacks.log: Python tracebacks (with chains) and Java stack traces (with
  `Caused by:`) between ordinary log lines; one truth line per physical line (the event's).
- logs/formats/NAME.log: logfmt, JSON lines, klog, RFC 5424 syslog, Python logging's default
  format, uvicorn and gunicorn access and error logs, vLLM's own log lines, Kubernetes events.

Every `.truth` has the true template of each line. The messages follow what these libraries
print (their formats are public); the values are generated. Deterministic.
"""
import argparse
import os
import random

R = random.Random(37)

HOSTS = ["api.openai.com", "api.anthropic.com", "search.internal", "vector-db.svc.cluster.local", "10.0.3.17", "redis-master.cache"]
TOOLS = ["web_search", "get_weather", "sql_query", "code_exec", "fetch_url", "calendar_lookup", "send_email"]
MODELS = ["gpt-4o", "gpt-4o-mini", "claude-3-5-sonnet", "llama-3.1-70b-instruct", "mistral-7b-instruct"]
KEYS = ["choices", "usage", "content", "tool_calls", "delta"]
PATHS = ["chat/completions", "embeddings", "responses", "messages"]


def hexs(n):
    return "".join(R.choice("0123456789abcdef") for _ in range(n))


def ip():
    return "%d.%d.%d.%d" % (R.randint(10, 200), R.randint(0, 255), R.randint(0, 255), R.randint(1, 254))


def num(a, b):
    return R.randint(a, b)


# (true template, make() -> message). A template names the kind; `<*>` marks its variables.
KINDS = [
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate <*> GiB. GPU <*> has a total capacity of <*> GiB of which <*> MiB is free.",
     lambda: "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate %.2f GiB. GPU %d has a total capacity of %.2f GiB of which %d MiB is free." % (R.uniform(0.1, 20), num(0, 7), R.choice([79.11, 39.39, 23.65]), num(1, 900))),
    ("RuntimeError: CUDA error: an illegal memory access was encountered",
     lambda: "RuntimeError: CUDA error: an illegal memory access was encountered"),
    ("RuntimeError: CUDA error: device-side assert triggered",
     lambda: "RuntimeError: CUDA error: device-side assert triggered"),
    ("RuntimeError: NCCL error in: <*>, unhandled system error, NCCL version <*>",
     lambda: "RuntimeError: NCCL error in: /opt/pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:%d, unhandled system error, NCCL version 2.%d.%d" % (num(1000, 2000), num(14, 21), num(1, 5))),
    ("RuntimeError: Expected all tensors to be on the same device, but found at least two devices, <*> and cpu!",
     lambda: "RuntimeError: Expected all tensors to be on the same device, but found at least two devices, cuda:%d and cpu!" % num(0, 7)),
    ("openai.RateLimitError: Error code: 429 - Rate limit reached for <*> in organization <*> on tokens per min (TPM): Limit <*>, Used <*>, Requested <*>.",
     lambda: "openai.RateLimitError: Error code: 429 - Rate limit reached for %s in organization org-%s on tokens per min (TPM): Limit %d, Used %d, Requested %d." % (R.choice(MODELS), hexs(12), R.choice([30000, 450000]), num(1000, 30000), num(10, 9000))),
    ("openai.APITimeoutError: Request timed out.",
     lambda: "openai.APITimeoutError: Request timed out."),
    ("openai.APIConnectionError: Connection error.",
     lambda: "openai.APIConnectionError: Connection error."),
    ("openai.BadRequestError: Error code: 400 - This model's maximum context length is <*> tokens. However, your messages resulted in <*> tokens.",
     lambda: "openai.BadRequestError: Error code: 400 - This model's maximum context length is %d tokens. However, your messages resulted in %d tokens." % (R.choice([8192, 16385, 128000]), num(8200, 200000))),
    ("anthropic.InternalServerError: Error code: 529 - overloaded_error: Overloaded",
     lambda: "anthropic.InternalServerError: Error code: 529 - overloaded_error: Overloaded"),
    ("httpx.ConnectTimeout: timed out",
     lambda: "httpx.ConnectTimeout: timed out"),
    ("httpx.ReadTimeout: timed out",
     lambda: "httpx.ReadTimeout: timed out"),
    ("httpx.ConnectError: [Errno 111] Connection refused",
     lambda: "httpx.ConnectError: [Errno 111] Connection refused"),
    ("requests.exceptions.ConnectTimeout: HTTPSConnectionPool(host=<*>, port=443): Max retries exceeded with url: <*> (Caused by ConnectTimeoutError(<urllib3.connection.HTTPSConnection object at <*>>, 'Connection to <*> timed out. (connect timeout=<*>)'))",
     lambda: (lambda h: "requests.exceptions.ConnectTimeout: HTTPSConnectionPool(host='%s', port=443): Max retries exceeded with url: /v1/%s (Caused by ConnectTimeoutError(<urllib3.connection.HTTPSConnection object at 0x7f%s>, 'Connection to %s timed out. (connect timeout=%d)'))" % (h, R.choice(PATHS), hexs(9), h, R.choice([5, 10, 30])))(R.choice(HOSTS))),
    ("requests.exceptions.ConnectionError: HTTPSConnectionPool(host=<*>, port=443): Max retries exceeded with url: <*> (Caused by ConnectTimeoutError(<urllib3.connection.HTTPSConnection object at <*>>, 'Connection to <*> timed out. (connect timeout=<*>)'))",
     lambda: (lambda h: "requests.exceptions.ConnectionError: HTTPSConnectionPool(host='%s', port=443): Max retries exceeded with url: /v1/%s (Caused by ConnectTimeoutError(<urllib3.connection.HTTPSConnection object at 0x7f%s>, 'Connection to %s timed out. (connect timeout=%d)'))" % (h, R.choice(PATHS), hexs(9), h, R.choice([5, 10, 30])))(R.choice(HOSTS))),
    ("redis.exceptions.ConnectionError: Error 111 connecting to <*>. Connection refused.",
     lambda: "redis.exceptions.ConnectionError: Error 111 connecting to %s:6379. Connection refused." % R.choice(["redis-master.cache", "10.0.4.2", "localhost"])),
    ("redis.exceptions.TimeoutError: Timeout reading from socket",
     lambda: "redis.exceptions.TimeoutError: Timeout reading from socket"),
    ("grpc._channel._InactiveRpcError: <_InactiveRpcError of RPC that terminated with: status = StatusCode.UNAVAILABLE details = \"failed to connect to all addresses; last error: UNKNOWN: <*>: Failed to connect to remote host: Connection refused\" debug_error_string = <*> >",
     lambda: "grpc._channel._InactiveRpcError: <_InactiveRpcError of RPC that terminated with: status = StatusCode.UNAVAILABLE details = \"failed to connect to all addresses; last error: UNKNOWN: ipv4:%s:%d: Failed to connect to remote host: Connection refused\" debug_error_string = \"UNKNOWN:Error received from peer {created_time:\"2026-11-27T20:%02d:%02d.%d+00:00\", grpc_status:14}\" >" % (ip(), num(50000, 50100), num(0, 59), num(0, 59), num(100000, 999999))),
    ("grpc._channel._InactiveRpcError: <_InactiveRpcError of RPC that terminated with: status = StatusCode.DEADLINE_EXCEEDED details = \"Deadline Exceeded\" debug_error_string = <*> >",
     lambda: "grpc._channel._InactiveRpcError: <_InactiveRpcError of RPC that terminated with: status = StatusCode.DEADLINE_EXCEEDED details = \"Deadline Exceeded\" debug_error_string = \"UNKNOWN:Deadline Exceeded {created_time:\"2026-11-27T20:%02d:%02d.%d+00:00\", grpc_status:4}\" >" % (num(0, 59), num(0, 59), num(100000, 999999))),
    ("vllm.engine.async_llm_engine.AsyncEngineDeadError: Background loop has errored already.",
     lambda: "vllm.engine.async_llm_engine.AsyncEngineDeadError: Background loop has errored already."),
    ("ValueError: The decoder prompt (length <*>) is longer than the maximum model length of <*>. Make sure that `max_model_len` is no smaller than the number of text tokens.",
     lambda: "ValueError: The decoder prompt (length %d) is longer than the maximum model length of %d. Make sure that `max_model_len` is no smaller than the number of text tokens." % (num(4097, 200000), R.choice([4096, 8192, 32768]))),
    ("json.decoder.JSONDecodeError: Expecting value: line <*> column <*> (char <*>)",
     lambda: "json.decoder.JSONDecodeError: Expecting value: line %d column %d (char %d)" % (num(1, 40), num(1, 200), num(0, 5000))),
    ("json.decoder.JSONDecodeError: Unterminated string starting at: line <*> column <*> (char <*>)",
     lambda: "json.decoder.JSONDecodeError: Unterminated string starting at: line %d column %d (char %d)" % (num(1, 40), num(1, 200), num(0, 5000))),
    ("pydantic_core._pydantic_core.ValidationError: <*> validation error for ToolCall",
     lambda: "pydantic_core._pydantic_core.ValidationError: %d validation error for ToolCall" % num(1, 4)),
    ("KeyError: <*>",
     lambda: "KeyError: '%s'" % R.choice(KEYS)),
    ("TimeoutError: tool <*> timed out after <*> s",
     lambda: "TimeoutError: tool %s timed out after %d s" % (R.choice(TOOLS), R.choice([10, 30, 60, 120]))),
    ("asyncio.exceptions.CancelledError: tool call <*> cancelled after <*> ms",
     lambda: "asyncio.exceptions.CancelledError: tool call call_%s cancelled after %d ms" % (hexs(24), num(100, 60000))),
    ("ConnectionResetError: [Errno 104] Connection reset by peer",
     lambda: "ConnectionResetError: [Errno 104] Connection reset by peer"),
    ("ssl.SSLCertVerificationError: [SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: unable to get local issuer certificate (_ssl.c:<*>)",
     lambda: "ssl.SSLCertVerificationError: [SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: unable to get local issuer certificate (_ssl.c:%d)" % R.choice([1000, 1006, 1129])),
    ("java.net.SocketTimeoutException: Read timed out",
     lambda: "java.net.SocketTimeoutException: Read timed out"),
    ("java.net.SocketTimeoutException: Connect timed out",
     lambda: "java.net.SocketTimeoutException: Connect timed out"),
    ("java.net.ConnectException: Connection refused (Connection refused)",
     lambda: "java.net.ConnectException: Connection refused (Connection refused)"),
    ("java.lang.OutOfMemoryError: Java heap space",
     lambda: "java.lang.OutOfMemoryError: Java heap space"),
    ("java.util.concurrent.TimeoutException: Timeout waiting for task <*> after <*> ms",
     lambda: "java.util.concurrent.TimeoutException: Timeout waiting for task %s after %d ms" % (hexs(8), num(1000, 30000))),
]


def raw_header(i):
    ts = "2026-11-27 %02d:%02d:%02d,%03d" % (num(0, 23), num(0, 59), num(0, 59), num(0, 999))
    style = i % 5
    if style == 0:
        return "%s ERROR %s: " % (ts, R.choice(["agent.worker", "app.llm", "gateway.router", "root"]))
    if style == 1:
        return "2026-11-27T%02d:%02d:%02d.%03dZ ERROR " % (num(0, 23), num(0, 59), num(0, 59), num(0, 999))
    if style == 2:
        return "ERROR:%s:" % R.choice(["root", "app.llm", "vllm.engine.async_llm_engine"])
    if style == 3:
        return "Nov %2d %02d:%02d:%02d gpu-node-%d python3[%d]: " % (num(1, 30), num(0, 23), num(0, 59), num(0, 59), num(1, 16), num(1000, 65000))
    return "ERROR:    "


def write(path, lines, truth):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(path[: -len(".log")] + ".truth", "w") as f:
        f.write("\n".join(truth) + "\n")


def llm(out, n=2000):
    # Zipf-like shares, each kind at least 8 times.
    weights = [1.0 / (k + 1) ** 0.8 for k in range(len(KINDS))]
    R.shuffle(weights)
    order = []
    for k in range(len(KINDS)):
        order += [k] * 8
    while len(order) < n:
        order.append(R.choices(range(len(KINDS)), weights)[0])
    R.shuffle(order)
    msgs, raw, truth = [], [], []
    for i, k in enumerate(order):
        t, make = KINDS[k]
        m = make()
        msgs.append(m)
        raw.append(raw_header(i) + m)
        truth.append(t)
    write(os.path.join(out, "failures/llm_messages.log"), msgs, truth)
    write(os.path.join(out, "failures/llm_raw.log"), raw, truth)


PY_TB = [
    # (truth, lead, frames [(file, line, func, src)], exception line)
    ("py-oom-generate", "Engine step failed", [("/app/serve/engine.py", 212, "step", "out = self.model(**batch)"), ("/usr/lib/python3.11/site-packages/torch/nn/modules/module.py", 1532, "_wrapped_call_impl", "return self._call_impl(*args, **kwargs)")],
     lambda: "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate %.2f GiB." % R.uniform(0.1, 9)),
    ("py-oom-prefill", "Engine step failed", [("/app/serve/prefill.py", 88, "prefill", "logits = self.model(ids)"), ("/usr/lib/python3.11/site-packages/torch/nn/modules/module.py", 1532, "_wrapped_call_impl", "return self._call_impl(*args, **kwargs)")],
     lambda: "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate %.2f GiB." % R.uniform(0.1, 9)),
    ("py-ratelimit", "LLM call failed", [("/app/agent/llm.py", 41, "complete", "resp = client.chat.completions.create(**kw)"), ("/usr/local/lib/python3.11/site-packages/openai/_base_client.py", 1059, "_request", "raise self._make_status_error_from_response(err.response) from None")],
     lambda: "openai.RateLimitError: Error code: 429 - Rate limit reached for requests"),
    ("py-readtimeout", "LLM call failed", [("/app/agent/llm.py", 41, "complete", "resp = client.chat.completions.create(**kw)"), ("/usr/local/lib/python3.11/site-packages/httpx/_transports/default.py", 86, "map_httpcore_exceptions", "raise mapped_exc(message) from exc")],
     lambda: "httpx.ReadTimeout: timed out"),
    ("py-connecttimeout", "LLM call failed", [("/app/agent/llm.py", 41, "complete", "resp = client.chat.completions.create(**kw)"), ("/usr/local/lib/python3.11/site-packages/httpx/_transports/default.py", 86, "map_httpcore_exceptions", "raise mapped_exc(message) from exc")],
     lambda: "httpx.ConnectTimeout: timed out"),
]

JAVA_TB = [
    ("java-timeout", "Request to model gateway failed",
     lambda: "java.net.SocketTimeoutException: Read timed out",
     ["java.base/java.net.SocketInputStream.socketRead0(Native Method)", "com.example.gateway.LlmClient.complete(LlmClient.java:%d)", "com.example.gateway.Router.route(Router.java:%d)"],
     "Caused by: java.io.IOException: stream closed"),
    ("java-pool", "Request to model gateway failed",
     lambda: "java.lang.IllegalStateException: Connection pool shut down",
     ["org.apache.http.impl.conn.PoolingHttpClientConnectionManager.requestConnection(PoolingHttpClientConnectionManager.java:269)", "com.example.gateway.LlmClient.complete(LlmClient.java:%d)", "com.example.gateway.Router.route(Router.java:%d)"],
     None),
]

PLAIN = [
    ("plain-req", lambda: "%s INFO app.http: request %s served in %d ms" % (ts_py(), hexs(8), num(3, 900))),
    ("plain-retry", lambda: "%s WARNING app.llm: retrying LLM call (attempt %d of 3)" % (ts_py(), num(1, 3))),
]


def ts_py():
    return "2026-11-27 %02d:%02d:%02d,%03d" % (num(0, 23), num(0, 59), num(0, 59), num(0, 999))


def tracebacks(out, events=240):
    lines, truth = [], []
    for _ in range(events):
        kind = R.random()
        if kind < 0.4:
            t, make = R.choice(PLAIN)
            lines.append(make())
            truth.append(t)
        elif kind < 0.8:
            t, lead, frames, exc = R.choice(PY_TB)
            ev = ["%s ERROR app.worker: %s" % (ts_py(), lead), "Traceback (most recent call last):"]
            if R.random() < 0.3:
                # A chain: the exception raised while handling another one.
                ev += ['  File "/app/agent/retry.py", line %d, in call' % num(10, 90), "    return fn()",
                       "KeyError: 'choices'", "", "During handling of the above exception, another exception occurred:", "",
                       "Traceback (most recent call last):"]
            for f, ln, fn, src in frames:
                ev += ['  File "%s", line %d, in %s' % (f, ln + num(0, 3), fn), "    " + src]
            ev.append(exc())
            lines += ev
            truth += [t] * len(ev)
        else:
            t, lead, exc, frames, cause = R.choice(JAVA_TB)
            ev = ["%s ERROR 1 --- [nio-8080-exec-%d] c.e.gateway.Router : %s" % (ts_py().replace(",", "."), num(1, 9), lead), exc()]
            ev += ["\tat " + (f % num(10, 300) if "%d" in f else f) for f in frames]
            if cause:
                ev += [cause, "\tat java.base/java.net.SocketInputStream.read(SocketInputStream.java:%d)" % num(100, 200), "\t... %d more" % num(5, 40)]
            lines += ev
            truth += [t] * len(ev)
    write(os.path.join(out, "failures/tracebacks.log"), lines, truth)


def rfc3339():
    return "2026-11-27T%02d:%02d:%02d.%03dZ" % (num(0, 23), num(0, 59), num(0, 59), num(0, 999))


def formats(out, n=400):
    F = {}
    F["logfmt"] = [
        ("level=info msg=\"request served\" method=<*> path=<*> status=<*> duration=<*>", lambda: "time=%s level=info msg=\"request served\" method=%s path=/v1/%s status=%d duration=%dms" % (rfc3339(), R.choice(["GET", "POST"]), R.choice(PATHS), R.choice([200, 201, 204]), num(1, 900))),
        ("level=error msg=\"upstream request failed\" upstream=<*> err=<*>", lambda: "time=%s level=error msg=\"upstream request failed\" upstream=%s:8000 err=\"dial tcp %s:8000: connect: connection refused\"" % (rfc3339(), ip(), ip())),
        ("level=warn msg=\"slow query\" db=<*> duration=<*>", lambda: "time=%s level=warn msg=\"slow query\" db=%s duration=%.1fs" % (rfc3339(), R.choice(["users", "sessions", "vectors"]), R.uniform(1, 30))),
        ("level=error msg=\"tool call timed out\" tool=<*> timeout=<*>", lambda: "time=%s level=error msg=\"tool call timed out\" tool=%s timeout=%ds" % (rfc3339(), R.choice(TOOLS), R.choice([5, 10, 30]))),
        ("level=info msg=\"cache hit\" key=<*>", lambda: "time=%s level=info msg=\"cache hit\" key=emb:%s" % (rfc3339(), hexs(16))),
        ("level=info msg=\"cache miss\" key=<*>", lambda: "time=%s level=info msg=\"cache miss\" key=emb:%s" % (rfc3339(), hexs(16))),
    ]
    F["jsonl"] = [
        ("request served", lambda: '{"ts":"%s","level":"info","logger":"app.http","msg":"request served","status":%d,"duration_ms":%d}' % (rfc3339(), R.choice([200, 201]), num(1, 900))),
        ("upstream request failed", lambda: '{"ts":"%s","level":"error","logger":"app.llm","msg":"upstream request failed","error":"httpx.ReadTimeout: timed out","upstream":"%s"}' % (rfc3339(), R.choice(HOSTS))),
        ("upstream request failed connect", lambda: '{"ts":"%s","level":"error","logger":"app.llm","msg":"upstream request failed","error":"httpx.ConnectTimeout: timed out","upstream":"%s"}' % (rfc3339(), R.choice(HOSTS))),
        ("token budget exceeded", lambda: '{"ts":"%s","level":"warning","logger":"app.agent","msg":"token budget exceeded for session %s: %d > %d"}' % (rfc3339(), hexs(12), num(8000, 20000), 8000)),
        ("tool finished", lambda: '{"ts":"%s","level":"info","logger":"app.tools","msg":"tool %s finished in %d ms"}' % (rfc3339(), R.choice(TOOLS), num(5, 5000))),
    ]
    F["klog"] = [
        ("Successfully pulled image <*> in <*>", lambda: "I1127 %02d:%02d:%02d.%06d    %d kuberuntime_image.go:%d] \"Successfully pulled image\" image=\"vllm/vllm-openai:v0.%d.%d\" duration=\"%.3fs\"" % (num(0, 23), num(0, 59), num(0, 59), num(0, 999999), num(1000, 9999), num(50, 60), num(5, 7), num(0, 3), R.uniform(1, 90))),
        ("Error syncing pod, skipping", lambda: "E1127 %02d:%02d:%02d.%06d    %d pod_workers.go:%d] \"Error syncing pod, skipping\" err=\"failed to \\\"StartContainer\\\" for \\\"vllm\\\" with CrashLoopBackOff\" pod=\"llm/vllm-%s\"" % (num(0, 23), num(0, 59), num(0, 59), num(0, 999999), num(1000, 9999), num(1200, 1300), hexs(5))),
        ("Probe failed", lambda: "I1127 %02d:%02d:%02d.%06d    %d prober.go:%d] \"Probe failed\" probeType=\"Readiness\" pod=\"llm/vllm-%s\" containerName=\"vllm\" probeResult=\"failure\"" % (num(0, 23), num(0, 59), num(0, 59), num(0, 999999), num(1000, 9999), num(100, 110), hexs(5))),
        ("Killing container with a grace period", lambda: "I1127 %02d:%02d:%02d.%06d    %d kuberuntime_container.go:%d] \"Killing container with a grace period\" pod=\"llm/vllm-%s\" containerName=\"vllm\" gracePeriod=%d" % (num(0, 23), num(0, 59), num(0, 59), num(0, 999999), num(1000, 9999), num(700, 800), hexs(5), R.choice([30, 60]))),
        ("Failed to get system container stats", lambda: "W1127 %02d:%02d:%02d.%06d    %d summary_sys_containers.go:%d] Failed to get system container stats for \"/system.slice/kubelet.service\": failed to get cgroup stats" % (num(0, 23), num(0, 59), num(0, 59), num(0, 999999), num(1000, 9999), num(40, 50))),
    ]
    F["rfc5424"] = [
        ("Connection from <*> port <*>", lambda: "<38>1 %s gw-%d sshd %d - - Connection from %s port %d on 10.0.0.2 port 22" % (rfc3339(), num(1, 9), num(1000, 60000), ip(), num(1024, 65535))),
        ("Out of memory: Killed process <*>", lambda: "<3>1 %s gpu-node-%d kernel - - - Out of memory: Killed process %d (python3) total-vm:%dkB, anon-rss:%dkB" % (rfc3339(), num(1, 16), num(1000, 60000), num(10**6, 10**8), num(10**6, 10**8))),
        ("NVRM: Xid <*>", lambda: "<4>1 %s gpu-node-%d kernel - - - NVRM: Xid (PCI:0000:%02x:00): %d, pid=%d, name=python3, Ch %08x" % (rfc3339(), num(1, 16), num(1, 200), R.choice([79, 31, 43]), num(1000, 60000), num(0, 99999))),
        ("Started <*>", lambda: "<30>1 %s gw-%d systemd 1 - - Started %s." % (rfc3339(), num(1, 9), R.choice(["vllm.service", "gateway.service", "node-exporter.service"]))),
        ("app structured data", lambda: "<11>1 %s app-%d agent %d ID47 [exampleSDID@32473 iut=\"3\" eventSource=\"Application\"] tool call failed: %s" % (rfc3339(), num(1, 9), num(1000, 60000), R.choice(TOOLS))),
    ]
    F["pylogging"] = [
        ("Retrying request to <*> in <*> seconds", lambda: "%s - openai._base_client - INFO - Retrying request to /%s in %.6f seconds" % (ts_py(), R.choice(PATHS), R.uniform(0.2, 8))),
        ("HTTP Request: POST <*> <*>", lambda: "%s - httpx - INFO - HTTP Request: POST https://%s/v1/%s \"HTTP/1.1 %s\"" % (ts_py(), R.choice(HOSTS), R.choice(PATHS), R.choice(["200 OK", "429 Too Many Requests"]))),
        ("Task exception was never retrieved", lambda: "%s - asyncio - ERROR - Task exception was never retrieved" % ts_py()),
        ("default format error", lambda: "ERROR:%s:tool %s failed after %d retries" % (R.choice(["root", "agent.tools"]), R.choice(TOOLS), num(1, 5))),
        ("default format warning", lambda: "WARNING:%s:context window %d%% full" % (R.choice(["root", "agent.memory"]), num(80, 99))),
    ]
    F["uvicorn"] = [
        # A status's reason phrase names the outcome: `200 OK` and `201 Created` are two.
        ("uvicorn access 200", lambda: "INFO:     %s:%d - \"POST /v1/%s HTTP/1.1\" 200 OK" % (ip(), num(1024, 65535), R.choice(PATHS))),
        ("uvicorn access 201", lambda: "INFO:     %s:%d - \"POST /v1/%s HTTP/1.1\" 201 Created" % (ip(), num(1024, 65535), R.choice(PATHS))),
        ("uvicorn access 5xx", lambda: "INFO:     %s:%d - \"POST /v1/%s HTTP/1.1\" 500 Internal Server Error" % (ip(), num(1024, 65535), R.choice(PATHS))),
        ("Exception in ASGI application", lambda: "ERROR:    Exception in ASGI application"),
        ("Started server process <*>", lambda: "INFO:     Started server process [%d]" % num(1000, 60000)),
        ("Waiting for application startup.", lambda: "INFO:     Waiting for application startup."),
    ]
    F["gunicorn"] = [
        ("gunicorn access", lambda: "%s - - [27/Nov/2026:%02d:%02d:%02d +0000] \"POST /v1/%s HTTP/1.1\" %d %d \"-\" \"python-httpx/0.27.0\"" % (ip(), num(0, 23), num(0, 59), num(0, 59), R.choice(PATHS), R.choice([200, 201]), num(100, 90000))),
        ("WORKER TIMEOUT (pid:<*>)", lambda: "[2026-11-27 %02d:%02d:%02d +0000] [%d] [CRITICAL] WORKER TIMEOUT (pid:%d)" % (num(0, 23), num(0, 59), num(0, 59), num(1, 99), num(1000, 60000))),
        ("Booting worker with pid: <*>", lambda: "[2026-11-27 %02d:%02d:%02d +0000] [%d] [INFO] Booting worker with pid: %d" % (num(0, 23), num(0, 59), num(0, 59), num(1000, 60000), num(1000, 60000))),
        ("Worker exiting (pid: <*>)", lambda: "[2026-11-27 %02d:%02d:%02d +0000] [%d] [INFO] Worker exiting (pid: %d)" % (num(0, 23), num(0, 59), num(0, 59), num(1000, 60000), num(1000, 60000))),
    ]
    F["vllm"] = [
        ("Avg prompt throughput", lambda: "INFO %02d-%02d %02d:%02d:%02d metrics.py:%d] Avg prompt throughput: %.1f tokens/s, Avg generation throughput: %.1f tokens/s, Running: %d reqs, Swapped: %d reqs, Pending: %d reqs, GPU KV cache usage: %.1f%%, CPU KV cache usage: %.1f%%." % (11, 27, num(0, 23), num(0, 59), num(0, 59), num(340, 350), R.uniform(0, 9000), R.uniform(0, 3000), num(0, 256), num(0, 9), num(0, 90), R.uniform(0, 100), R.uniform(0, 10))),
        ("Sequence group preempted", lambda: "WARNING %02d-%02d %02d:%02d:%02d scheduler.py:%d] Sequence group %d is preempted by PreemptionMode.RECOMPUTE mode because there is not enough KV cache space. This can affect the end-to-end performance. Increase gpu_memory_utilization or tensor_parallel_size to provide more KV cache memory. total_num_cumulative_preemption=%d" % (11, 27, num(0, 23), num(0, 59), num(0, 59), num(1000, 1100), num(1, 9999), num(1, 500))),
        ("Added request", lambda: "INFO %02d-%02d %02d:%02d:%02d engine.py:%d] Added request chatcmpl-%s." % (11, 27, num(0, 23), num(0, 59), num(0, 59), num(260, 280), hexs(32))),
        ("Aborted request", lambda: "INFO %02d-%02d %02d:%02d:%02d async_llm_engine.py:%d] Aborted request chatcmpl-%s." % (11, 27, num(0, 23), num(0, 59), num(0, 59), num(60, 70), hexs(32))),
        ("Engine background task failed", lambda: "ERROR %02d-%02d %02d:%02d:%02d async_llm_engine.py:%d] Engine background task failed" % (11, 27, num(0, 23), num(0, 59), num(0, 59), num(60, 70))),
    ]
    F["k8s_events"] = [
        ("BackOff", lambda: "%dm         Warning   BackOff            pod/vllm-%s   Back-off restarting failed container vllm in pod vllm-%s_llm(%s)" % (num(1, 59), hexs(5), hexs(5), hexs(8))),
        ("FailedScheduling", lambda: "%dm         Warning   FailedScheduling   pod/vllm-%s   0/%d nodes are available: %d Insufficient nvidia.com/gpu." % (num(1, 59), hexs(5), num(4, 16), num(1, 16))),
        ("Unhealthy", lambda: "%ds         Warning   Unhealthy          pod/vllm-%s   Readiness probe failed: Get \"http://%s:8000/health\": dial tcp %s:8000: connect: connection refused" % (num(1, 59), hexs(5), ip(), ip())),
        ("Pulled", lambda: "%dm         Normal    Pulled             pod/vllm-%s   Container image \"vllm/vllm-openai:v0.%d.%d\" already present on machine" % (num(1, 59), hexs(5), num(5, 7), num(0, 3))),
        ("OOMKilling", lambda: "%dm         Warning   OOMKilling         node/gpu-node-%d   Memory cgroup out of memory: Killed process %d (python3)" % (num(1, 59), num(1, 16), num(1000, 60000))),
    ]
    for name, kinds in sorted(F.items()):
        lines, truth = [], []
        for i in range(n):
            t, make = kinds[i % len(kinds)] if i < 3 * len(kinds) else R.choice(kinds)
            lines.append(make())
            truth.append(t)
        write(os.path.join(out, "logs/formats/%s.log" % name), lines, truth)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="testdata")
    a = ap.parse_args()
    llm(a.out)
    tracebacks(a.out)
    formats(a.out)


if __name__ == "__main__":
    main()
