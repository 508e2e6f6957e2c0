'use strict'
// Small HTTP helpers on node:http: JSON bodies in and out (BigInt-safe).

const MAX_BODY = 64 * 1024

/** JSON that can carry BigInt figures (usage past 2^53) as numbers' digits. */
function json (value) {
  try {
    return JSON.stringify(value) // the usual case, without a replacer call per key
  } catch (err) {
    if (!(err instanceof TypeError)) throw err
    return JSON.stringify(value, (k, v) => (typeof v === 'bigint' ? v.toString() : v))
  }
}

class HttpError extends Error {
  constructor (status, message, extra = {}) {
    super(message)
    this.status = status
    this.extra = extra
  }
}

/** The request's JSON body, an object; 400 when it is not one, 413 when too long. */
function readJson (req) {
  return new Promise((resolve, reject) => {
    let data = ''
    let size = 0
    req.setEncoding('utf8')
    req.on('data', (chunk) => {
      size += chunk.length
      if (size > MAX_BODY) {
        reject(new HttpError(413, `the body is longer than ${MAX_BODY} bytes`))
        req.destroy()
        return
      }
      data += chunk
    })
    req.on('end', () => {
      let body
      try {
        body = JSON.parse(data)
      } catch (err) {
        reject(new HttpError(400, 'the body is not JSON'))
        return
      }
      if (body === null || typeof body !== 'object' || Array.isArray(body)) {
        reject(new HttpError(400, 'the body must be a JSON object'))
        return
      }
      resolve(body)
    })
    req.on('error', reject)
  })
}

function send (res, status, body, headers = {}) {
  const text = json(body)
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text), ...headers })
  res.end(text)
}

module.exports = { json, readJson, send, HttpError }
