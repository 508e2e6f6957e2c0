-- wrk script of bench/node/run: POST one event {tenant, meter, amount}
-- per request, of a random tenant among TENANTS (env, default 10000;
-- "hot" when TENANTS=0), named TENANT_PREFIX (env, default "t") and its
-- number, with an id unique to the run when IDS=1 (the idempotency key:
-- "RUN_ID-thread-n"); prints one line bench/node/run
-- parses.  Every endpoint of the bench takes this body: the queue peer and
-- the app read the meter and the id, server.js only the tenant and amount.
local tenants = tonumber(os.getenv("TENANTS") or "10000")
local prefix = os.getenv("TENANT_PREFIX") or "t"
local ids = os.getenv("IDS") == "1"
local run = os.getenv("RUN_ID") or "r"
local threads = 0
local tid = 0
local counter = 0

wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"

function setup(thread)
  thread:set("tid", threads)
  threads = threads + 1
end

function init(args)
  tid = wrk.thread:get("tid") or 0
end

request = function()
  local tenant = "hot"
  if tenants > 0 then tenant = prefix .. math.random(0, tenants - 1) end
  if not ids then
    return wrk.format(nil, nil, nil, '{"tenant":"' .. tenant .. '","meter":"api_calls","amount":1}')
  end
  counter = counter + 1
  return wrk.format(nil, nil, nil, string.format('{"tenant":"%s","meter":"api_calls","amount":1,"id":"%s-%d-%d"}',
    tenant, run, tid, counter))
end

-- ok: the 2xx answers (wrk counts every status above 399 in errors.status,
-- and no endpoint here answers 3xx)
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("BENCH requests=%d ok=%d duration_us=%d p50_us=%d p95_us=%d p99_us=%d non2xx=%d connect=%d read=%d write=%d timeout=%d\n",
    summary.requests, summary.requests - e.status, summary.duration, latency:percentile(50), latency:percentile(95),
    latency:percentile(99), e.status, e.connect, e.read, e.write, e.timeout))
end
