-- Appended to every scenario: print the figures as one JSON line.
function done(summary, latency, requests)
  io.write(string.format(
    'BENCH {"requests": %d, "duration_s": %.3f, "errors": %d, "non_2xx": %d, ' ..
    '"p50_ms": %.3f, "p95_ms": %.3f, "p99_ms": %.3f}\n',
    summary.requests, summary.duration / 1e6,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    summary.errors.status,
    latency:percentile(50) / 1000, latency:percentile(95) / 1000, latency:percentile(99) / 1000))
end
