'use strict'
// The Redis rate limiter of the rate peers (bench/node/run rate): GCRA, the
// generic cell rate algorithm, as one Lua script run atomically by Redis,
// the usual design (redis-cell's CL.THROTTLE, and the scripts of the
// rate-limit libraries around ioredis and node-redis, work this way).  A
// key's state is one number, its theoretical arrival time (TAT) in
// microseconds, read from Redis's own clock (TIME) so that every app
// process agrees; the key expires when it is back to a full burst.  It is
// the algorithm flagmeter's limiter runs in shared memory, so both sides of
// a rate design decide the same way.
//
// The script goes by EVALSHA (node-redis's defineScript: EVAL once when the
// server does not know it yet), and node-redis pipelines the calls of
// concurrent requests on its one connection.
const { createClient, defineScript } = require('redis')

// KEYS[1] the key; ARGV[1] the emission interval (microseconds per unit),
// ARGV[2] the burst (units), ARGV[3] the cost (units).  Returns
// {1, remaining} when allowed, {0, retry_after_us} when refused
// (retry_after_us -1: the cost exceeds the burst, waiting cannot help).
const SCRIPT = `
local interval = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local tat = tonumber(redis.call('GET', KEYS[1])) or now
if tat < now then tat = now end
local cap = burst * interval
local new_tat = tat + cost * interval
if cost > burst then return {0, -1} end
if new_tat - now > cap then return {0, new_tat - cap - now} end
redis.call('SET', KEYS[1], string.format('%.0f', new_tat), 'PX', math.ceil((new_tat - now) / 1000))
return {1, math.floor((cap - (new_tat - now)) / interval)}
`

const gcra = defineScript({
  SCRIPT,
  NUMBER_OF_KEYS: 1,
  parseCommand (parser, key, interval, burst, cost) {
    parser.pushKey(key)
    parser.push(String(interval), String(burst), String(cost))
  },
  transformReply (reply) { return reply }
})

/**
 * A connected Redis client with the limiter, and limit(): rate units per
 * perSeconds in bursts of burst (default rate), cost units (default 1).
 * @param {string} url
 */
async function connectLimiter (url) {
  const redis = createClient({ url, scripts: { gcra } })
  redis.on('error', (err) => console.error('redis:', err.message))
  await redis.connect()
  /**
   * @returns {Promise<{allowed: boolean, remaining: number | null, retryAfterMs: number | null}>}
   */
  async function limit (key, rate, perSeconds, burst = rate, cost = 1) {
    const interval = Math.ceil(perSeconds * 1e6 / rate)
    const [allowed, n] = await redis.gcra(key, interval, burst, cost)
    if (allowed === 1) return { allowed: true, remaining: Number(n), retryAfterMs: null }
    return { allowed: false, remaining: 0, retryAfterMs: n < 0 ? null : Math.ceil(Number(n) / 1000) }
  }
  return { redis, limit }
}

module.exports = { connectLimiter, SCRIPT }
