-- wrk script of bench/e2e: POST one event of a random tenant among
-- TENANTS (env; "hot" when TENANTS=0), and print P95 and the error count
-- as a line bench/e2e/run parses.
local tenants = tonumber(os.getenv("TENANTS") or "10000")
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"

request = function()
  local tenant = "hot"
  if tenants > 0 then tenant = "t" .. math.random(0, tenants - 1) end
  return wrk.format(nil, nil, nil, '{"tenant":"' .. tenant .. '","amount":1}')
end

done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("E2E requests=%d duration_us=%d p50_us=%d p95_us=%d p99_us=%d non2xx=%d connect=%d read=%d write=%d timeout=%d\n",
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(95),
    latency:percentile(99), e.status, e.connect, e.read, e.write, e.timeout))
end
