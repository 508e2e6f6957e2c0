'use strict'
// Groups concurrent calls into one server call per transaction, adaptively
// and without a timer (the localQueue idea of graphile-worker, turned
// around: there it fetches jobs in batches, here it sends them).
//
// A call that arrives while fewer than maxInFlight groups are running goes
// at once, alone: an idle app pays no wait.  Calls that arrive while every
// slot is busy queue up, and the next free slot takes all of them (up to
// maxGroup) as one group.  So the group size follows the load: one at low
// rates, about (arrival rate x transaction time / maxInFlight) under load.
//
// Why the limits exist:
// - maxInFlight (default 2): each group holds a pool connection for one
//   transaction.  More groups in flight give smaller groups and more
//   transactions for the same work (and take connections the app's own
//   queries need); fewer leave the database idle while a group commits.  At
//   1 200 connections on the 2-core benchmark machine (bench/e2e), 2 beat 4
//   in each of three alternating rounds (+6 to +17 % req/s), 1 and 3 were
//   no better than 2, and 8 was worse than 4; a database with more cores
//   may want more.
// - maxGroup (default 500): one statement's arrays, and one transaction's
//   locks and WAL, stay bounded, and a failed group fails at most that many
//   callers.
//
// Every promise settles: with its own result, with the group's error (each
// caller of a failed group gets it, SQLSTATE in err.code), or with the
// error close() gives calls queued after it.

class Batcher {
  /**
   * @param {object} opts
   * @param {(items: any[]) => Promise<any[]>} opts.run  one result per item, in order
   * @param {number} [opts.maxInFlight]
   * @param {number} [opts.maxGroup]
   */
  constructor ({ run, maxInFlight = 2, maxGroup = 500 }) {
    if (!Number.isInteger(maxInFlight) || maxInFlight < 1) throw new RangeError(`maxInFlight must be a positive integer: ${maxInFlight}`)
    if (!Number.isInteger(maxGroup) || maxGroup < 1) throw new RangeError(`maxGroup must be a positive integer: ${maxGroup}`)
    this._run = run
    this._maxInFlight = maxInFlight
    this._maxGroup = maxGroup
    this._queue = []
    this._inFlight = 0
    this._idle = []
    this.groups = 0
    this.calls = 0
  }

  /** Queue one call; resolves with its result once its group committed. */
  push (item) {
    return new Promise((resolve, reject) => {
      this._queue.push({ item, resolve, reject })
      this._pump()
    })
  }

  /** Resolves when nothing is queued or running (close() waits for it). */
  drain () {
    if (this._queue.length === 0 && this._inFlight === 0) return Promise.resolve()
    return new Promise((resolve) => this._idle.push(resolve))
  }

  _pump () {
    while (this._inFlight < this._maxInFlight && this._queue.length > 0) {
      const group = this._queue.splice(0, this._maxGroup)
      this._inFlight++
      this.groups++
      this.calls += group.length
      this._send(group)
    }
    if (this._inFlight === 0 && this._queue.length === 0) {
      const idle = this._idle
      this._idle = []
      for (const resolve of idle) resolve()
    }
  }

  async _send (group) {
    try {
      const results = await this._run(group.map((g) => g.item))
      if (!Array.isArray(results) || results.length !== group.length) {
        throw new Error(`flagmeter: a group of ${group.length} calls got ${results && results.length} answers`)
      }
      group.forEach((g, i) => g.resolve(results[i]))
    } catch (err) {
      for (const g of group) g.reject(err)
    } finally {
      this._inFlight--
      this._pump()
    }
  }
}

module.exports = { Batcher }
