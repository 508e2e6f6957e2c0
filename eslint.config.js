'use strict'
// ESLint over all the JavaScript of the repository (npm run lint, and the
// `lint` suite of make test): neostandard, the flat-config successor of
// `standard`, which is the style the code is written in (2 spaces, no
// semicolons, single quotes, a space before a function's parentheses).
// Node everywhere but the dashboard's page, which runs in a browser.
// TypeScript (clients/node's declarations) is `npm run typecheck`'s.
const neostandard = require('neostandard')
const globals = require('globals')

module.exports = [
  ...neostandard({
    ignores: [
      ...neostandard.resolveIgnoresFromGitignore(),
      'examples/dashboard/test/output/**'
    ]
  }),
  {
    rules: {
      // Where today's code parts from `standard`, in layout only: object
      // literals with a few properties a line over several lines, a
      // ternary's branches on one line or split after the condition, SQL
      // indented with tabs inside template literals.
      '@stylistic/object-property-newline': 'off',
      '@stylistic/multiline-ternary': 'off',
      '@stylistic/no-tabs': ['error', { allowIndentationTabs: true }],
      // The load loops of the fault suites and benches run until a flag
      // that another callback (a timer, a signal) sets, which this rule
      // cannot see.
      'no-unmodified-loop-condition': 'off'
    }
  },
  {
    files: ['examples/dashboard/public/**/*.js'],
    languageOptions: {
      sourceType: 'script',
      globals: { ...globals.browser, uPlot: 'readonly' }
    },
    rules: {
      'new-cap': ['error', { newIsCapExceptions: ['uPlot'] }]
    }
  }
]
