-- wrk script of bench/dashboard: POST /api/events of one event of a random
-- tenant among TENANTS (env, default 10000), with an id unique to the run
-- (the idempotency key; none with NO_IDS=1); prints the counts
-- bench/dashboard/run parses.
local tenants = tonumber(os.getenv("TENANTS") or "10000")
local run = os.getenv("RUN_ID") or "r"
local threads = {}
local counter = 0
local tid = 0

function setup(thread)
  thread:set("tid", #threads)
  table.insert(threads, thread)
end

function init(args)
  tid = wrk.thread:get("tid") or 0
  ok = 0
  wrk.method = "POST"
  wrk.headers["Content-Type"] = "application/json"
end

local ids = os.getenv("NO_IDS") ~= "1"

request = function()
  counter = counter + 1
  if not ids then
    return wrk.format(nil, nil, nil, string.format('{"tenant":"t%d","meter":"api_calls","amount":1}', math.random(0, tenants - 1)))
  end
  return wrk.format(nil, nil, nil, string.format('{"tenant":"t%d","meter":"api_calls","amount":1,"id":"%s-%d-%d"}',
    math.random(0, tenants - 1), run, tid, counter))
end

response = function(status, headers, body)
  if status >= 200 and status < 300 then ok = ok + 1 end
end

done = function(summary, latency, requests)
  local answered = 0
  for _, t in ipairs(threads) do answered = answered + t:get("ok") end
  local e = summary.errors
  io.write(string.format("BENCH requests=%d ok=%d duration_us=%d p50_us=%d p95_us=%d p99_us=%d non2xx=%d connect=%d read=%d write=%d timeout=%d\n",
    summary.requests, answered, summary.duration, latency:percentile(50), latency:percentile(95),
    latency:percentile(99), e.status, e.connect, e.read, e.write, e.timeout))
end
