'use strict'
// The number rule: bigint columns (amounts, usage, quotas, versions) come
// back as JavaScript numbers while they are safe integers, as BigInt beyond
// 2^53 - 1, and never as strings.  node-postgres returns int8 as a string
// by default, because a number would silently lose digits; we decide per
// value instead, and only for our own queries (the `types` of each query
// config), so the app's own pool keeps its parsers.

const pg = require('pg')

// oids (pg's TypeId lists no array types: plain numbers)
/** @type {number} */
const INT8 = 20
/** @type {number} */
const INT8_ARRAY = 1016

/**
 * A decimal integer text as a number when safe, else a BigInt.
 * @param {string | null | undefined} text
 * @returns {import('./interfaces').Int | null}
 */
function toInt (text) {
  if (text === null || text === undefined) return null
  const n = Number(text)
  if (Number.isSafeInteger(n)) return n
  return BigInt(text)
}

/**
 * @param {string} text  an int8[] literal
 * @returns {Array<import('./interfaces').Int | null>}
 */
function parseInt8Array (text) {
  /** @type {Array<string | number | null>} */
  const strings = pg.types.getTypeParser(INT8_ARRAY, 'text')(text)
  // the default parser for int8[] yields strings (or numbers in some versions)
  return strings.map((s) => (s === null ? null : toInt(String(s))))
}

/**
 * The `types` of every query the client runs.
 * @type {import('pg').CustomTypesConfig}
 */
const types = {
  /**
   * @param {number} oid
   * @param {'text' | 'binary'} [format]
   */
  getTypeParser (oid, format) {
    if (format !== 'binary') {
      if (oid === INT8) return toInt
      if (oid === INT8_ARRAY) return parseInt8Array
    }
    return pg.types.getTypeParser(oid, format)
  }
}

/**
 * A bigint of the client (a number or a BigInt) as a BigInt, to compare
 * versions whatever their size.
 * @param {import('./interfaces').Int} v
 * @returns {bigint}
 */
function big (v) {
  return typeof v === 'bigint' ? v : BigInt(v)
}

/**
 * A value given as an amount: a non-negative safe integer number or a
 * BigInt; anything else is a TypeError or RangeError thrown before it can
 * join (and fail) a group of other callers' calls.
 * @param {unknown} value
 * @param {string} what  its name in the error
 * @param {boolean} [positive]  0 refused too
 * @returns {import('./interfaces').Int}
 */
function checkAmount (value, what, positive) {
  if (typeof value === 'bigint') {
    if (value < 0n || (positive && value === 0n)) throw new RangeError(`${what} must be ${positive ? 'positive' : 'non-negative'}: ${value}`)
    if (value > 9223372036854775807n) throw new RangeError(`${what} is out of the bigint range: ${value}`)
    return value
  }
  if (typeof value !== 'number' || !Number.isSafeInteger(value)) {
    throw new TypeError(`${what} must be a safe integer number or a BigInt, got ${typeof value === 'number' ? value : typeof value}`)
  }
  if (value < 0 || (positive && value === 0)) throw new RangeError(`${what} must be ${positive ? 'positive' : 'non-negative'}: ${value}`)
  return value
}

/**
 * JSON.parse for notification payloads, with the number rule: integers
 * beyond the safe range become BigInt instead of losing digits.  Numbers
 * inside strings (a tenant id like "a:12345678901234567") are left alone:
 * the scan skips string literals.
 * @param {string} text
 * @returns {any}
 */
function parseJson (text) {
  let out = ''
  let last = 0
  let big = false
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i)
    if (c === 34) { // a string: skip to its closing quote
      for (i++; i < text.length && text.charCodeAt(i) !== 34; i++) {
        if (text.charCodeAt(i) === 92) i++ // backslash escape
      }
    } else if (c === 45 || (c >= 48 && c <= 57)) { // a number
      let j = i + 1
      while (j < text.length && /[0-9.eE+-]/.test(text[j])) j++
      const token = text.slice(i, j)
      if (/^-?\d{16,}$/.test(token) && !Number.isSafeInteger(Number(token))) {
        out += text.slice(last, i) + `"\\u0000${token}"`
        last = j
        big = true
      }
      i = j - 1
    }
  }
  if (!big) return JSON.parse(text)
  out += text.slice(last)
  return JSON.parse(out, (key, value) =>
    typeof value === 'string' && value.charCodeAt(0) === 0 ? BigInt(value.slice(1)) : value)
}

module.exports = { types, toInt, big, checkAmount, parseJson }
