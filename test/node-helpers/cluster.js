'use strict'
// Throwaway PostgreSQL clusters: the one a suite's runner starts when no
// PGHOST is given (runner.js), and those the fault suites of clients/node
// and examples/dashboard (and bench/faults) start of their own, restart,
// crash, run out of connections and fail over to a standby; pgbouncer in
// front of them (restarted, paused, re-pointed).  Nothing here touches the
// cluster `make test` hands over in PGHOST/PGPORT.
//
// Where the server's programs come from:
// - FLAGMETER_PG_RUN (tools/test.sh sets it): a command that runs its
//   arguments as the cluster owner with the PostgreSQL under test first on
//   PATH (in its chroot for 17 and 18), and FLAGMETER_FAULT_DIR, a directory
//   that command can write (the clusters' data and sockets go there);
// - otherwise PostgreSQL 15 of this machine (FLAGMETER_PG_BINDIR, default
//   /usr/lib/postgresql/15/bin), as the current user, or as postgres
//   through runuser when run as root, in a temp directory of /tmp.
// Either way flagmeter must be installed in that PostgreSQL.  pgbouncer is
// Debian's, on this machine, never as root.
const { spawn, spawnSync } = require('node:child_process')
const fs = require('node:fs')
const net = require('node:net')
const os = require('node:os')
const path = require('node:path')
const pg = require('pg')
const { sleep } = require('./db')
const { RANGES, portRange } = require('./ports')

const asRoot = process.getuid && process.getuid() === 0
const RUN = process.env.FLAGMETER_PG_RUN || null
const BINDIR = process.env.FLAGMETER_PG_BINDIR || '/usr/lib/postgresql/15/bin'
const SUPERUSER = 'postgres'
const PGBOUNCER = '/usr/sbin/pgbouncer'

const PROGRAMS = new Set(['initdb', 'pg_ctl', 'pg_basebackup'])

/** argv that runs cmd (a PostgreSQL program, or mkdir, sh, rm) as the cluster owner. */
function serverCommand (cmd, args) {
  if (RUN) return [RUN, [cmd, ...args]] // the version's binaries are first on its PATH
  const bin = PROGRAMS.has(cmd) ? path.join(BINDIR, cmd) : cmd
  return asRoot ? ['runuser', ['-u', 'postgres', '--', bin, ...args]] : [bin, args]
}

function run (argv, what) {
  const r = spawnSync(argv[0], argv[1], { encoding: 'utf8' })
  if (r.status !== 0) throw new Error(`${what} failed (${r.status ?? r.signal}): ${r.stderr || r.stdout}`)
  return r.stdout
}

function serverRun (cmd, args) {
  return run(serverCommand(cmd, args), `${cmd} ${args.join(' ')}`)
}

/** serverRun without blocking the event loop: the load of a test goes on meanwhile. */
function serverRunAsync (cmd, args) {
  const [c, a] = serverCommand(cmd, args)
  return new Promise((resolve, reject) => {
    const child = spawn(c, a, { stdio: ['ignore', 'pipe', 'pipe'] })
    let out = ''
    child.stdout.on('data', (d) => { out += d })
    child.stderr.on('data', (d) => { out += d })
    child.on('error', reject)
    child.on('exit', (code, sig) => (code === 0 ? resolve(out) : reject(new Error(`${cmd} ${args.join(' ')} failed (${code ?? sig}): ${out}`))))
  })
}

// Whatever a test leaves running is stopped when the process exits,
// however the test ended.
const live = new Set()
process.on('exit', () => {
  for (const x of live) x.destroySync()
  if (ownBase) fs.rmSync(ownBase, { recursive: true, force: true })
})

/** The directory the clusters live in: FLAGMETER_FAULT_DIR, or a new one owned by the cluster owner. */
let baseDir = null
let ownBase = null
function base () {
  if (baseDir) return baseDir
  if (process.env.FLAGMETER_FAULT_DIR) {
    baseDir = process.env.FLAGMETER_FAULT_DIR
  } else {
    baseDir = ownBase = fs.mkdtempSync(path.join('/tmp', 'fm-clusters-'))
    if (asRoot) run(['chown', ['postgres:', baseDir]], 'chown')
  }
  return baseDir
}

// The fault suites' ports (ports.js), unless Cluster.create is given others.
const faultPorts = portRange(...RANGES.faults)

class Cluster {
  constructor (name, dir, port, ports = faultPorts) {
    this.name = name
    this.dir = dir
    this.data = path.join(dir, 'data')
    this.port = port
    this.ports = ports
    this.host = '127.0.0.1'
  }

  /**
   * initdb and start a cluster with flagmeter preloaded, listening on
   * 127.0.0.1 and on a unix socket in its directory (this.dir); conf: more
   * postgresql.conf lines; ports: the portRange its port comes from (the
   * fault suites' by default).
   */
  static async create (name, { conf = {}, ports = faultPorts } = {}) {
    const dir = path.join(base(), `${name}-${process.pid}`)
    fs.rmSync(dir, { recursive: true, force: true })
    const c = new Cluster(name, dir, await ports.take(), ports)
    live.add(c)
    serverRun('mkdir', ['-p', dir])
    serverRun('initdb', ['-D', c.data, '-U', SUPERUSER, '-A', 'trust', '-E', 'UTF8', '--locale=C', '--no-instructions'])
    c.configure({
      listen_addresses: "'127.0.0.1'",
      unix_socket_directories: `'${dir}'`,
      shared_preload_libraries: "'flagmeter'",
      max_connections: 100,
      ...conf
    })
    // a port found free can be taken before the server binds it (another
    // run on this machine picks from the same range): then take another
    for (let tries = 1; ; tries++) {
      try {
        c.start()
        return c
      } catch (err) {
        if (tries >= 5 || !/could not bind|could not create any TCP\/IP sockets/.test(c.log())) throw err
        c.port = await ports.take()
        c.configure({})
      }
    }
  }

  /** Append settings to postgresql.conf (the last one of a name wins). */
  configure (settings) {
    const lines = Object.entries({ port: this.port, ...settings }).map(([k, v]) => `${k} = ${v}`).join('\n')
    serverRun('sh', ['-c', 'printf "%s\\n" "$1" >> "$2"', 'sh', lines, path.join(this.data, 'postgresql.conf')])
  }

  start () {
    serverRun('pg_ctl', ['-D', this.data, '-l', path.join(this.dir, 'server.log'), '-w', '-t', '60', 'start'])
  }

  stop (mode = 'fast') {
    serverRun('pg_ctl', ['-D', this.data, '-m', mode, '-w', '-t', '60', 'stop'])
  }

  restart (mode = 'fast') {
    serverRun('pg_ctl', ['-D', this.data, '-l', path.join(this.dir, 'server.log'), '-m', mode, '-w', '-t', '60', 'restart'])
  }

  /** Stop the server now, no shutdown checkpoint (as a crash), then start it: crash recovery. */
  crash () {
    this.stop('immediate')
    this.start()
  }

  // The same, without blocking the event loop (for faults under a load of
  // the same process).
  startAsync () {
    return serverRunAsync('pg_ctl', ['-D', this.data, '-l', path.join(this.dir, 'server.log'), '-w', '-t', '60', 'start'])
  }

  stopAsync (mode = 'fast') {
    return serverRunAsync('pg_ctl', ['-D', this.data, '-m', mode, '-w', '-t', '60', 'stop'])
  }

  restartAsync (mode = 'fast') {
    return serverRunAsync('pg_ctl', ['-D', this.data, '-l', path.join(this.dir, 'server.log'), '-m', mode, '-w', '-t', '60', 'restart'])
  }

  async crashAsync () {
    await this.stopAsync('immediate')
    await this.startAsync()
  }

  promoteAsync () {
    return serverRunAsync('pg_ctl', ['-D', this.data, '-w', '-t', '60', 'promote'])
  }

  /** pg_ctl stop that returns at once; the server goes on its own. */
  stopInBackground (mode = 'fast') {
    const [cmd, args] = serverCommand('pg_ctl', ['-D', this.data, '-m', mode, '-W', 'stop'])
    spawnSync(cmd, args)
  }

  /** A streaming standby of this cluster (pg_basebackup -R), started. */
  async standby (name) {
    const dir = path.join(base(), `${name}-${process.pid}`)
    fs.rmSync(dir, { recursive: true, force: true })
    const s = new Cluster(name, dir, await faultPorts.take())
    live.add(s)
    serverRun('mkdir', ['-p', dir])
    serverRun('pg_basebackup', ['-h', this.host, '-p', String(this.port), '-U', SUPERUSER, '-D', s.data, '-R', '-X', 'stream', '-c', 'fast'])
    s.configure({ unix_socket_directories: `'${dir}'` })
    s.start()
    return s
  }

  promote () {
    serverRun('pg_ctl', ['-D', this.data, '-w', '-t', '60', 'promote'])
  }

  connection (database = 'postgres', extra = {}) {
    return { host: this.host, port: this.port, user: SUPERUSER, database, ...extra }
  }

  url (database = 'postgres') {
    return `postgresql://${SUPERUSER}@${this.host}:${this.port}/${database}`
  }

  /** One statement on a connection of its own. */
  async sql (database, text, values) {
    const c = new pg.Client(this.connection(database))
    c.on('error', () => {})
    await c.connect()
    try {
      return await c.query(text, values)
    } finally {
      await c.end().catch(() => {})
    }
  }

  /** Wait until the server accepts connections (after a start in the background). */
  async waitReady (ms = 60000) {
    const end = Date.now() + ms
    for (;;) {
      try {
        await this.sql('postgres', 'SELECT 1')
        return
      } catch (err) {
        if (Date.now() > end) throw err
        await sleep(50)
      }
    }
  }

  /** A database with flagmeter and setupSql. */
  async createDatabase (name, setupSql = '') {
    await this.sql('postgres', `CREATE DATABASE ${name}`)
    await this.sql(name, 'CREATE EXTENSION flagmeter')
    if (setupSql) await this.sql(name, setupSql)
    return name
  }

  /** pg_terminate_backend of every session of database but the caller's (application_name filter optional). */
  async terminate (database, { applicationName } = {}) {
    const { rows } = await this.sql('postgres', `
      SELECT count(pg_terminate_backend(pid))::int AS n FROM pg_stat_activity
       WHERE datname = $1 AND pid <> pg_backend_pid() AND backend_type = 'client backend'
         AND ($2::text IS NULL OR application_name = $2)`, [database, applicationName ?? null])
    return rows[0].n
  }

  /** Stop the server (immediate) and delete it. */
  destroy () {
    this.destroySync()
  }

  destroySync () {
    live.delete(this)
    try {
      if (fs.existsSync(path.join(this.data, 'postmaster.pid'))) this.stop('immediate')
    } catch {}
    try { serverRun('rm', ['-rf', this.dir]) } catch {}
    this.ports.release(this.port)
  }

  log () {
    try { return fs.readFileSync(path.join(this.dir, 'server.log'), 'utf8') } catch { return '' }
  }
}

/** pgbouncer in front of a cluster, in transaction mode, on 127.0.0.1. */
class Pgbouncer {
  constructor (dir, port) {
    this.dir = dir
    this.port = port
    this.host = '127.0.0.1'
    this.child = null
  }

  /**
   * sessionDatabases: each also reachable as <name>_session in session
   * mode, for a LISTEN session that follows pgbouncer's target.
   */
  static async create (target, { poolMode = 'transaction', poolSize = 20, sessionDatabases = [] } = {}) {
    if (!fs.existsSync(PGBOUNCER)) throw new Error('pgbouncer is not installed (Debian package pgbouncer)')
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'fm-pgbouncer-'))
    if (asRoot) run(['chown', ['postgres:', dir]], 'chown')
    const b = new Pgbouncer(dir, await faultPorts.take())
    live.add(b)
    b.poolMode = poolMode
    b.poolSize = poolSize
    b.sessionDatabases = sessionDatabases
    b.writeConfig(target)
    await b.start()
    return b
  }

  writeConfig (target) {
    this.target = target
    fs.writeFileSync(path.join(this.dir, 'users.txt'), `"${SUPERUSER}" ""\n`)
    fs.writeFileSync(path.join(this.dir, 'pgbouncer.ini'), [
      '[databases]',
      ...this.sessionDatabases.map((d) => `${d}_session = host=${target.host} port=${target.port} dbname=${d} pool_mode=session`),
      `* = host=${target.host} port=${target.port}`,
      '[pgbouncer]',
      `listen_addr = ${this.host}`,
      `listen_port = ${this.port}`,
      "unix_socket_dir = ''",
      'auth_type = trust',
      `auth_file = ${path.join(this.dir, 'users.txt')}`,
      `admin_users = ${SUPERUSER}`,
      `pool_mode = ${this.poolMode}`,
      `default_pool_size = ${this.poolSize}`,
      'max_client_conn = 2000',
      'ignore_startup_parameters = extra_float_digits,options',
      'server_reset_query =',
      // a server that refused a login is tried again after 1 s, not 15: a
      // failover's new primary is used as soon as it is there
      'server_login_retry = 1',
      `logfile = ${path.join(this.dir, 'pgbouncer.log')}`,
      ''
    ].join('\n'))
    if (asRoot) run(['chown', ['-R', 'postgres:', this.dir]], 'chown')
  }

  async start () {
    const ini = path.join(this.dir, 'pgbouncer.ini')
    // setpriv execs pgbouncer itself: the child is pgbouncer, for signals
    const [cmd, args] = asRoot
      ? ['setpriv', ['--reuid=postgres', '--regid=postgres', '--clear-groups', '--', PGBOUNCER, ini]]
      : [PGBOUNCER, [ini]]
    this.child = spawn(cmd, args, { stdio: 'ignore' })
    const child = this.child
    this.exited = new Promise((resolve) => child.on('exit', resolve))
    const end = Date.now() + 10000
    for (;;) {
      try {
        await this.admin('SHOW VERSION')
        return
      } catch (err) {
        if (Date.now() > end) throw new Error(`pgbouncer did not start: ${err.message}`)
        await sleep(50)
      }
    }
  }

  /** A command of pgbouncer's admin console (PAUSE, RESUME, RELOAD, SHOW ...). */
  async admin (command) {
    const c = new pg.Client({ host: this.host, port: this.port, user: SUPERUSER, database: 'pgbouncer' })
    c.on('error', () => {})
    await c.connect()
    try {
      return await c.query(command)
    } finally {
      await c.end().catch(() => {})
    }
  }

  /** Point pgbouncer at another server and RELOAD (as after a failover). */
  async repoint (target) {
    this.writeConfig(target)
    await this.admin('RELOAD')
  }

  /** Stop the process (SIGTERM: it closes every client connection) and wait for it. */
  async stop () {
    if (!this.child || this.child.exitCode !== null) return
    this.child.kill('SIGTERM')
    await this.exited
  }

  async restart () {
    await this.stop()
    await this.start()
  }

  connection (database, extra = {}) {
    return { host: this.host, port: this.port, user: SUPERUSER, database, ...extra }
  }

  url (database) {
    return `postgresql://${SUPERUSER}@${this.host}:${this.port}/${database}`
  }

  async destroy () {
    await this.stop().catch(() => {})
    this.destroySync()
  }

  destroySync () {
    live.delete(this)
    if (this.child && this.child.exitCode === null) this.child.kill('SIGKILL')
    fs.rmSync(this.dir, { recursive: true, force: true })
    faultPorts.release(this.port)
  }
}

/**
 * A TCP proxy to target that hands the server's bytes on in batches,
 * every 30 ms, as a busy network or a busy client reads them: a session's
 * login and what the server sent right after it arrive in one read.
 */
function batchingProxy (target) {
  const sockets = new Set()
  const server = net.createServer((down) => {
    const up = net.connect(target.port, target.host)
    let held = []
    const flush = () => {
      if (held.length && !down.destroyed) down.write(Buffer.concat(held))
      held = []
    }
    const timer = setInterval(flush, 30)
    const end = () => {
      clearInterval(timer)
      flush()
      down.destroy()
      up.destroy()
    }
    up.on('data', (d) => held.push(d))
    up.on('close', () => setTimeout(end, 30))
    down.on('close', end)
    up.on('error', () => {})
    down.on('error', () => {})
    down.pipe(up)
    sockets.add(down)
    down.on('close', () => sockets.delete(down))
  })
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve({
    host: '127.0.0.1',
    port: server.address().port,
    close: () => new Promise((resolve) => {
      for (const sock of sockets) sock.destroy()
      server.close(resolve)
    })
  })))
}

module.exports = { Cluster, Pgbouncer, batchingProxy, serverCommand }
