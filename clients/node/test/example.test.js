'use strict'
// The README's example app (examples/app.js) runs and does what it says.
const { test, before, after } = require('node:test')
const assert = require('node:assert/strict')
const path = require('node:path')
const { spawn } = require('node:child_process')
const { createDatabase } = require('./helpers')

let db
before(async () => {
  db = await createDatabase('fm_node_example', `
    SELECT flagmeter.define_meter('api_calls');
    SELECT flagmeter.define_plan('free');
    SELECT flagmeter.set_limit('free', 'api_calls', 2, 'month');
    SELECT flagmeter.assign_plan('acme', 'free');`)
})
after(async () => { await db.drop() })

test('the example app: durable events, 429 at the limit, blocked from the cache', async () => {
  const url = `postgresql://${process.env.PGUSER}@/${db.name}?host=${encodeURIComponent(process.env.PGHOST)}&port=${process.env.PGPORT}`
  const app = spawn(process.execPath, [path.join(__dirname, '..', 'examples', 'app.js')], {
    env: { ...process.env, DATABASE_URL: url, PORT: '0' },
    stdio: ['ignore', 'pipe', 'inherit']
  })
  let out = ''
  app.stdout.on('data', (d) => { out += d })
  try {
    const port = await new Promise((resolve, reject) => {
      app.stdout.on('data', () => { const m = /listening on (\d+)/.exec(out); if (m) resolve(Number(m[1])) })
      app.on('exit', (code) => reject(new Error(`app exited ${code}`)))
    })
    const call = async (method, p, body) => {
      const r = await fetch(`http://127.0.0.1:${port}${p}`, { method, body: body && JSON.stringify(body) })
      return { status: r.status, headers: r.headers, body: await r.json() }
    }
    assert.deepEqual((await call('POST', '/api/events', { tenant: 'acme', meter: 'api_calls', key: 'e1' })).body, { counted: true })
    assert.deepEqual((await call('POST', '/api/events', { tenant: 'acme', meter: 'api_calls', key: 'e1' })).body, { counted: false })
    const ok = await call('POST', '/api/requests', { tenant: 'acme' })
    assert.equal(ok.status, 200)
    assert.equal(ok.headers.get('x-ratelimit-remaining'), '0')
    const refused = await call('POST', '/api/requests', { tenant: 'acme' })
    assert.equal(refused.status, 429)
    assert.equal((await call('GET', '/api/usage?tenant=acme&meter=api_calls')).body.used, 2)
    assert.equal((await call('POST', '/api/events', { tenant: 'acme', meter: 'nope' })).status, 400)
    // a tenant never assigned a plan is refused (QT001): forbidden
    const stranger = await call('POST', '/api/requests', { tenant: 'stranger' })
    assert.equal(stranger.status, 403)
    assert.match(stranger.body.error, /not assigned a plan/)
    // the blocked event reached the app (and its log)
    for (let i = 0; i < 100 && !/acme is blocked/.test(out); i++) await new Promise((resolve) => setTimeout(resolve, 50))
    assert.match(out, /acme reached 100% of api_calls/)
    assert.match(out, /acme is blocked on api_calls/)
  } finally {
    app.kill('SIGTERM')
    await new Promise((resolve) => app.on('exit', resolve))
  }
})
