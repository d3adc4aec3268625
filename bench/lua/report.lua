-- Appended to every generated wrk script: prints one machine-readable summary line.
-- Latencies are in microseconds; errors: socket (connect/read/write/timeout) and
-- HTTP status >= 400 (wrk's "Non-2xx or 3xx" counter; no scenario answers 3xx).
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRK_JSON {"requests":%d,"duration_us":%d,"bytes":%d,"connect":%d,"read":%d,' ..
    '"write":%d,"status":%d,"timeout":%d,"p50_us":%d,"p90_us":%d,"p99_us":%d,' ..
    '"max_us":%d,"mean_us":%.1f}\n',
    summary.requests, summary.duration, summary.bytes, e.connect, e.read, e.write,
    e.status, e.timeout, latency:percentile(50.0), latency:percentile(90.0),
    latency:percentile(99.0), latency.max, latency.mean))
end
