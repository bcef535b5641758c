"""A stand-in for an unmodified engine's HTTP process: ``python -m tests.service.metrics_engine
COUNT_FILE PORT_FILE``. It serves ``GET /metrics`` as vLLM's Prometheus endpoint does (gauges
``vllm:num_requests_running`` and ``vllm:num_requests_waiting``, with a ``model_name`` label,
among other families), the running count read from COUNT_FILE at each request (the test
writes it), appends that count to COUNT_FILE.reads (one line a read), and exits 0 on SIGTERM
once it has closed its socket. ``GET /endless`` is a page that never ends (comment lines, sent
until the reader goes away); each one it served is counted in COUNT_FILE.endless, with the
bytes the reader took. ``GET /slow`` is ``/metrics`` held back while COUNT_FILE.slow
exists."""

from __future__ import annotations

import http.server
import json
import os
import signal
import sys
import threading
from pathlib import Path

PAGE = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="tiny"}} {running}.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{engine="0",model_name="tiny"}} {waiting}.0
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{{engine="0",model_name="tiny"}} 1234.0
# HELP vllm:e2e_request_latency_seconds Histogram of e2e request latency in seconds.
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{{engine="0",le="0.3",model_name="tiny"}} 2.0
vllm:e2e_request_latency_seconds_bucket{{engine="0",le="+Inf",model_name="tiny"}} 5.0
vllm:e2e_request_latency_seconds_count{{engine="0",model_name="tiny"}} 5.0
vllm:e2e_request_latency_seconds_sum{{engine="0",model_name="tiny"}} 3.5
"""


def main(count_file: Path, port_file: Path) -> None:
    reads = count_file.with_suffix(".reads")
    endless = threading.Condition()
    endless_open = [0]  # endless reads still being served: each is recorded before it ends
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/endless":
                self.endless()
                return
            if self.path == "/slow":  # held while the test keeps COUNT_FILE.slow
                while count_file.with_suffix(".slow").exists() and not stop.is_set():
                    stop.wait(0.05)
            running, _, waiting = count_file.read_text().strip().partition(" ")
            with reads.open("a") as log:  # what the test counts: each read, with its answer
                log.write(f"{running}\n")
            body = PAGE.format(running=int(running), waiting=int(waiting or 0)).encode()
            self.send_response(200 if self.path in ("/metrics", "/slow") else 404)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def endless(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            line = b"# " + b"x" * 1022 + b"\n"
            sent = 0
            with endless:
                endless_open[0] += 1
            try:
                while True:
                    self.wfile.write(line * 64)
                    sent += len(line) * 64
            except OSError:
                with count_file.with_suffix(".endless").open("a") as log:
                    log.write(f"{sent}\n")
                with endless:
                    endless_open[0] -= 1
                    endless.notify_all()

        def log_message(self, *_args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    threading.Thread(target=server.serve_forever, daemon=True).start()
    tmp = port_file.with_suffix(".tmp")
    tmp.write_text(json.dumps({"port": server.server_address[1], "pid": os.getpid()}))
    tmp.replace(port_file)
    stop.wait()
    with endless:  # so the test reads every endless read's record once this has exited
        endless.wait_for(lambda: not endless_open[0], timeout=30)
    server.shutdown()
    server.server_close()
    sys.exit(0)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
