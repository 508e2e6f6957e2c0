'use strict'
// A webhook receiver for `make dashboard`: prints the "text" of every alert
// the app POSTs (what Slack would show) and answers 200.
//
//   node receiver.js PORT
const http = require('node:http')

const port = Number(process.argv[2])
const server = http.createServer((req, res) => {
  let data = ''
  req.on('data', (d) => { data += d })
  req.on('end', () => {
    try {
      const alert = JSON.parse(data)
      console.log(`webhook: ${alert.text} (v${alert.version})`)
    } catch {
      console.log(`webhook: unreadable body: ${data.slice(0, 200)}`)
    }
    res.writeHead(200)
    res.end('ok')
  })
})
server.listen(port, '127.0.0.1', () => console.log(`webhook receiver on http://127.0.0.1:${port}/`))
const stop = () => server.close(() => process.exit(0))
process.on('SIGINT', stop)
process.on('SIGTERM', stop)
