// The dashboard page: one EventSource to the app (/api/stream), no polling.
// `state` events redraw the tenants, blocked, rate-limited and top lists; `quota` events
// add to the latest events at once; `series` events redraw the chart of the
// chosen tenant and meter.  Choosing another one reopens the stream with it.
// A unique meter counts distinct values (active users, seats): its bar and
// chart say so (its unit, else "distinct values"), and its chart is per UTC
// day over 30 days, since distinct counts of minutes would not add up.
/* global uPlot, EventSource */
(function () {
  'use strict'
  const $ = (id) => document.getElementById(id)
  const view = { state: null, series: null, updates: { state: 0, series: 0, quota: 0 }, chart: null }
  window.dashboard = view // for the browser test: what is drawn, and how often it changed

  function el (tag, props = {}, ...children) {
    const e = document.createElement(tag)
    for (const [k, v] of Object.entries(props)) {
      if (k === 'class') e.className = v
      else if (k === 'data') for (const [dk, dv] of Object.entries(v)) e.dataset[dk] = dv
      else e.setAttribute(k, v)
    }
    for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(String(c)))
    return e
  }

  const fmt = (n) => (n === null || n === undefined ? '∞' : Number(n).toLocaleString('en'))

  const isUnique = (m) => m.aggregation === 'unique'
  // what a unique meter's figures count
  const distinctUnit = (m) => m.unit || 'distinct values'

  /** The meter's row of the latest state (its aggregation and unit), or null. */
  function meterInfo (meter) {
    for (const t of view.state?.tenants ?? []) {
      const m = t.meters.find((x) => x.meter === meter)
      if (m) return m
    }
    return null
  }

  function bar (m) {
    const pct = m.quota ? Math.min(100, (Number(m.used) / Number(m.quota)) * 100) : 0
    const figures = `${fmt(m.used)} / ${fmt(m.quota)}${isUnique(m) ? ' ' + distinctUnit(m) : ''} · ${Math.round(pct)} %`
    return el('div', { class: `bar ${m.state}`, data: { meter: m.meter, state: m.state, used: String(m.used), aggregation: m.aggregation } },
      el('div', { class: 'label' }, el('span', {}, m.meter), el('span', { class: 'figures' }, figures)),
      el('div', { class: 'track' }, el('div', { class: 'fill', style: `width:${pct.toFixed(1)}%` })))
  }

  function renderTenants (tenants) {
    const body = $('tenants').tBodies[0]
    body.replaceChildren(...tenants.map((t) => el('tr', { data: { tenant: t.tenant } },
      el('td', {}, t.tenant), el('td', {}, t.plan), el('td', {}, el('div', { class: 'meters' }, ...t.meters.map(bar))))))
    fillSelect($('tenant-select'), tenants.map((t) => t.tenant), chosen.tenant)
    const meters = [...new Set(tenants.flatMap((t) => t.meters.map((m) => m.meter)))].sort()
    fillSelect($('meter-select'), meters, chosen.meter)
  }

  function fillSelect (sel, values, current) {
    const have = [...sel.options].map((o) => o.value)
    if (have.join('\u0000') === values.join('\u0000')) return
    sel.replaceChildren(...values.map((v) => el('option', { value: v }, v)))
    if (current && values.includes(current)) sel.value = current
  }

  function renderBlocked (blocked) {
    $('blocked').replaceChildren(...(blocked.length
      ? blocked.map((b) => el('li', { data: { tenant: b.tenant, meter: b.meter } }, `${b.tenant} · ${b.meter}`,
        el('span', { class: 'muted' }, b.until ? ` until ${new Date(b.until).toLocaleString()}` : ' (lifetime)')))
      : [el('li', { class: 'muted' }, 'none')]))
  }

  function renderRateLimited (tenants) {
    $('rate-limited').replaceChildren(...(tenants.length
      ? tenants.map((t) => el('li', { data: { tenant: t.tenant, count: String(t.count) } }, `${t.tenant} · `,
        el('strong', {}, fmt(t.count)), el('span', { class: 'muted' }, t.count === 1 ? ' request' : ' requests')))
      : [el('li', { class: 'muted' }, 'none')]))
  }

  function renderTop (top) {
    $('top').tBodies[0].replaceChildren(...top.map((t) => el('tr', { data: { tenant: t.tenant, meter: t.meter } },
      el('td', {}, t.meter), el('td', {}, t.tenant), el('td', {}, `${Math.round(t.ratio * 100)} %`), el('td', { class: 'muted' }, t.state))))
  }

  function describe (e) {
    if (e.kind === 'threshold') return `${e.tenant} reached ${e.threshold} % of ${e.meter} (${fmt(e.used)} / ${fmt(e.quota)})`
    if (e.kind === 'blocked') return `${e.tenant} blocked on ${e.meter} (${fmt(e.used)} / ${fmt(e.quota)})`
    if (e.kind === 'unblocked') return `${e.tenant} unblocked on ${e.meter}`
    if (e.kind === 'limit_changed') return `limit of ${e.meter} changed for ${e.tenant ?? 'plan ' + e.plan}`
    return `${e.tenant} moved to plan ${e.plan}`
  }

  function renderEvents (events) {
    $('events').replaceChildren(...(events.length
      ? events.map((e) => el('li', { data: { version: String(e.version), kind: e.kind } },
        el('span', { class: `kind ${e.kind}` }, e.kind), describe(e),
        el('span', { class: 'muted' }, ` · v${e.version} · ${new Date(e.at).toLocaleTimeString()}`)))
      : [el('li', { class: 'muted' }, 'none yet')]))
  }

  function renderSeries (s) {
    if (s.error) {
      $('chart-total').textContent = s.error
      return
    }
    const xs = s.points.map((p) => Number(p[0]))
    const ys = s.points.map((p) => Number(p[1]))
    const chart = $('chart')
    chart.dataset.bucket = s.bucket
    let label
    if (s.bucket === 'day') {
      // distinct values per day: a sum of days would count a value once a day
      const unit = distinctUnit(meterInfo(s.meter) ?? {})
      const today = ys.length ? ys[ys.length - 1] : 0
      $('chart-title').textContent = 'Last 30 days, distinct per day (UTC)'
      $('chart-total').textContent = `${fmt(today)} ${unit} today`
      chart.dataset.today = String(today)
      delete chart.dataset.total
      label = `${s.meter}: ${unit} per day`
    } else {
      const total = ys.reduce((a, b) => a + b, 0)
      $('chart-title').textContent = 'Last hour, per minute'
      $('chart-total').textContent = `${fmt(total)} ${s.meter} in the last hour`
      chart.dataset.total = String(total)
      delete chart.dataset.today
      label = `${s.meter} per minute`
    }
    const data = [xs, ys]
    if (view.chart && view.chartLabel !== label) {
      // the legend names the meter and what it counts: a new chart for another one
      view.chart.destroy()
      view.chart = null
    }
    view.chartLabel = label
    if (!view.chart) {
      view.chart = new uPlot({
        width: Math.max(300, chart.clientWidth),
        height: 220,
        series: [{}, { label, stroke: '#1c7ed6', fill: 'rgba(28,126,214,.15)', width: 2 }],
        axes: [{}, { size: 60 }],
        scales: { x: { time: true } }
      }, data, chart)
    } else {
      view.chart.setData(data)
    }
  }

  const chosen = { tenant: null, meter: null }
  let source = null

  function connect () {
    if (source) source.close()
    const q = chosen.tenant && chosen.meter ? `?tenant=${encodeURIComponent(chosen.tenant)}&meter=${encodeURIComponent(chosen.meter)}` : ''
    source = new EventSource('/api/stream' + q)
    source.onopen = () => { $('conn').textContent = 'live'; $('conn').className = 'conn up' }
    source.onerror = () => { $('conn').textContent = 'reconnecting…'; $('conn').className = 'conn down' }
    source.addEventListener('state', (m) => {
      const s = JSON.parse(m.data)
      view.state = s
      view.updates.state++
      $('instance').textContent = s.instance
      renderTenants(s.tenants)
      renderBlocked(s.blocked)
      renderRateLimited(s.rate_limited)
      renderTop(s.top)
      renderEvents(s.events)
      if (!chosen.tenant && s.tenants.length) {
        // first state: chart the first tenant's first meter
        chosen.tenant = s.tenants[0].tenant
        chosen.meter = s.tenants[0].meters[0].meter
        $('tenant-select').value = chosen.tenant
        $('meter-select').value = chosen.meter
        connect()
      }
    })
    // the app's own connection to the database: a banner while it is lost
    source.addEventListener('database', (m) => {
      $('database').hidden = JSON.parse(m.data).connected
    })
    source.addEventListener('quota', (m) => {
      const e = JSON.parse(m.data)
      view.updates.quota++
      if (!view.state) return
      view.state.events = [e, ...view.state.events.filter((x) => String(x.version) !== String(e.version))].slice(0, 20)
      renderEvents(view.state.events)
    })
    source.addEventListener('series', (m) => {
      const s = JSON.parse(m.data)
      if (s.tenant !== chosen.tenant || s.meter !== chosen.meter) return
      view.series = s
      view.updates.series++
      renderSeries(s)
    })
  }

  $('tenant-select').addEventListener('change', (e) => { chosen.tenant = e.target.value; connect() })
  $('meter-select').addEventListener('change', (e) => { chosen.meter = e.target.value; connect() })
  window.addEventListener('resize', () => { if (view.chart) view.chart.setSize({ width: $('chart').clientWidth, height: 220 }) })
  connect()
})()
