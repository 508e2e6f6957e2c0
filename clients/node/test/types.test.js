'use strict'
// The shipped declarations describe the API: a TypeScript file using it
// compiles with tsc --strict, and the misuses it marks @ts-expect-error are
// rejected (an unused @ts-expect-error is an error too).  And the code is
// what they describe: tsconfig.json checks src/*.js against them.
const { test } = require('node:test')
const assert = require('node:assert/strict')
const fs = require('node:fs')
const path = require('node:path')
const { spawnSync } = require('node:child_process')

test('the type declarations compile as an app uses them (CommonJS and ESM)', () => {
  const tsc = require.resolve('typescript/bin/tsc')
  const root = path.join(__dirname, '..')
  // the same file as an ES module (.mts): the import condition, index.d.mts
  const esm = path.join(__dirname, 'types', 'usage.generated.mts')
  fs.copyFileSync(path.join(__dirname, 'types', 'usage.ts'), esm)
  try {
    for (const file of ['usage.ts', 'usage.generated.mts']) {
      const r = spawnSync(process.execPath, [tsc, '--noEmit', '--strict', '--module', 'node16', '--moduleResolution', 'node16',
        '--target', 'es2022', path.join(__dirname, 'types', file)], { cwd: root, encoding: 'utf8' })
      assert.equal(r.status, 0, r.stdout + r.stderr)
    }
  } finally {
    fs.rmSync(esm, { force: true })
  }
})

test('the implementation matches the declarations (npm run typecheck: checkJs, strict)', () => {
  const tsc = require.resolve('typescript/bin/tsc')
  const root = path.join(__dirname, '..')
  const r = spawnSync(process.execPath, [tsc, '-p', path.join(root, 'tsconfig.json')], { cwd: root, encoding: 'utf8' })
  assert.equal(r.status, 0, r.stdout + r.stderr)
})
